"""Loading with resharding: each rank reads exactly the byte ranges it needs.

A checkpoint saved under any world size and layout loads into any other: for every wanted
range of a tensor the reader finds the saved shards that overlap it and reads those bytes
(whole 4 MiB blocks, whose checksums it checks) from the saved ranks' files, never a whole
file unless the range spans it. Locally a read is a pread; in an object store (an
`s3://` checkpoint directory) each block is one ranged GET.
"""

from __future__ import annotations

import os
import pickle
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from engine.checkpoint import store
from engine.checkpoint.layout import (
    BLOCK_BYTES,
    MANIFEST,
    CheckpointError,
    CheckpointInfo,
    CorruptCheckpoint,
    find_latest_good,
    inspect,
    list_checkpoints,
)
from engine.checkpoint.store import Url
from engine.checkpoint.writer import ShardedState

Checkpoint = str | os.PathLike[str] | Url | CheckpointInfo

# name -> [(global element offset, length)]
Wants = dict[str, list[tuple[int, int]]]


def is_checkpoint(where: str | os.PathLike[str] | Url) -> bool:
    """Whether `where` names one checkpoint (a step folder) rather than a folder of them."""
    where = store.location(where)
    return where.name.startswith("step-") or store.exists(where / MANIFEST)


def resolve(checkpoint: Checkpoint) -> CheckpointInfo:
    """A good checkpoint from a step folder, or the newest good one in a checkpoint directory
    (either may be a local path or a URL)."""
    if isinstance(checkpoint, CheckpointInfo):
        info = checkpoint
    elif is_checkpoint(checkpoint):
        info = inspect(checkpoint)
    else:
        info, _ = find_latest_good(checkpoint)
        if info is None:
            raise CheckpointError(f"no good checkpoint in {checkpoint}")
    if not info.good:
        raise CorruptCheckpoint(f"checkpoint {info.path} is not usable: {info.problem}")
    return info


def open_checkpoint(checkpoint: Checkpoint) -> CheckpointReader:
    """A reader of one checkpoint (use as a context manager to close its files)."""
    return CheckpointReader(resolve(checkpoint))


def load_into(checkpoint: Checkpoint, targets: ShardedState) -> None:
    """Fill each target shard in place with its global range of the saved tensor.

    `targets` has the shape `save()` takes (name -> (shard, global offset, global length)),
    e.g. the new layout's `sharded_state()`, so its buffers receive the restored values.
    """
    with open_checkpoint(checkpoint) as reader:
        reader.fill(targets)


def load(
    checkpoint: Checkpoint, wants: Wants
) -> dict[str, list[torch.Tensor]]:
    """New flat tensors holding the wanted `(global offset, length)` ranges of each tensor."""
    with open_checkpoint(checkpoint) as reader:
        return {
            name: [reader.read(name, offset, length) for offset, length in ranges]
            for name, ranges in wants.items()
        }


def read_extras(checkpoint: Checkpoint, rank: int) -> Any:
    """The extras object that saved `rank` passed to `save()` (checksum-checked)."""
    with open_checkpoint(checkpoint) as reader:
        return reader.extras(rank)


@dataclass
class Restored:
    """What `restore()` loaded (None: nothing usable), and the checkpoints it passed over."""

    checkpoint: CheckpointInfo | None
    skipped: list[CheckpointInfo] = field(default_factory=list)

    @property
    def step(self) -> int | None:
        return self.checkpoint.step if self.checkpoint is not None else None

    def extras(self, rank: int = 0) -> Any:
        if self.checkpoint is None:
            raise CheckpointError("nothing was restored, so there are no extras")
        return read_extras(self.checkpoint, rank)


def restore(
    directories: list[str | os.PathLike[str] | Url],
    targets: ShardedState | Callable[[CheckpointReader], None],
    *,
    group: Any = None,
) -> Restored:
    """Load the newest checkpoint that every rank can read into `targets`.

    `targets` is either a sharded state whose shards are filled in place, or a function
    given the open `CheckpointReader`, e.g. `lambda r: sdp.load_sharded_state(r.read)`.

    Candidates are all checkpoints in `directories`, newest first (at equal steps the earlier
    directory first, so pass the memory tier first). Collective when torch.distributed is
    initialised: all ranks try the same candidate and move on together if any rank found it
    corrupt. Every checkpoint passed over is in `.skipped` with its `.problem`, for the loop
    to publish as an anomaly; `.checkpoint` is None when no checkpoint could be loaded.
    """
    listed = [
        (info.step, -order, info)
        for order, d in enumerate(directories)
        for info in list_checkpoints(d)
    ]
    candidates = [info for _, _, info in sorted(listed, key=lambda c: c[:2], reverse=True)]
    _agree([len(candidates)] + [c.step for c in candidates[:1]], group)
    skipped = []
    for info in candidates:
        if info.good:
            try:
                with CheckpointReader(info) as reader:
                    if isinstance(targets, dict):
                        reader.fill(targets)
                    else:
                        targets(reader)
            except CorruptCheckpoint as e:
                info.good, info.problem = False, str(e)
            failed_somewhere = _any_rank(not info.good, group)
            if failed_somewhere and info.good:
                info.good, info.problem = False, "another rank found it corrupt"
        if info.good:
            return Restored(info, skipped)
        skipped.append(info)
    return Restored(None, skipped)


def _agree(facts: list[int], group: Any) -> None:
    """Raise unless every rank sees the same checkpoint listing (count, newest step)."""
    if not (dist.is_initialized() and dist.get_world_size(group) > 1):
        return
    mine = torch.tensor(facts + [-1] * (2 - len(facts)), dtype=torch.int64)
    high, low = mine.clone(), -mine
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(low, op=dist.ReduceOp.MAX, group=group)
    if not torch.equal(high, -low):
        raise CheckpointError(
            "ranks see different checkpoint listings; every rank must see the same directories"
        )


def _any_rank(flag: bool, group: Any) -> bool:
    if not (dist.is_initialized() and dist.get_world_size(group) > 1):
        return flag
    value = torch.tensor([int(flag)], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value.item())


class CheckpointReader:
    """Reads checksum-checked ranges of one checkpoint's tensors from the saved ranks' files."""

    def __init__(self, info: CheckpointInfo) -> None:
        self.info = info
        self.tensors: dict[str, dict[str, Any]] = info.manifest["tensors"]
        self.parts = {p["rank"]: p for p in info.manifest["parts"]}
        # name -> [(global offset, numel, rank, byte offset)] sorted by global offset
        self.pieces: dict[str, list[tuple[int, int, int, int]]] = {}
        for rank, part in self.parts.items():
            for s in part["shards"]:
                piece = (s["offset"], s["numel"], rank, s["byte_offset"])
                self.pieces.setdefault(s["name"], []).append(piece)
        for pieces in self.pieces.values():
            pieces.sort()
        self.files: dict[int, int] = {}  # rank -> open fd (local files)
        self.bytes_read = 0  # fetched from the files, all ranks (what a ranged load costs)
        self.block = bytearray(BLOCK_BYTES)
        self.cached: tuple[int, int] | None = None  # (rank, block index) held in self.block

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self.files.values():
            os.close(fd)

    def read(self, name: str, offset: int, length: int) -> torch.Tensor:
        """A new flat tensor with elements [offset, offset + length) of tensor `name`."""
        entry = self.check(name, None, None)
        tensor = torch.empty(length, dtype=getattr(torch, entry["dtype"]))
        self.read_into(name, offset, tensor)
        return tensor

    def fill(self, targets: ShardedState) -> None:
        """Fill every (shard, global offset, global length) of `targets` in place."""
        for name, value in targets.items():
            if not (isinstance(value, tuple) and len(value) == 3):
                raise TypeError(f"targets[{name!r}] must be (shard, global_offset, global_length)")
            shard, offset, length = value
            self.check(name, shard.dtype, length)
            self.read_into(name, offset, shard)

    def extras(self, rank: int) -> Any:
        """The extras object that saved `rank` passed to `save()`."""
        if rank not in self.parts:
            raise CheckpointError(
                f"rank {rank} is not in {self.info.path}: it was saved by "
                f"{self.info.world_size} ranks"
            )
        extras = self.parts[rank]["extras"]
        buffer = bytearray(extras["nbytes"])
        self.read_bytes(rank, extras["byte_offset"], memoryview(buffer))
        return pickle.loads(buffer)

    def check(self, name: str, dtype: torch.dtype | None, length: int | None) -> dict[str, Any]:
        entry = self.tensors.get(name)
        if entry is None:
            known = ", ".join(sorted(self.tensors)[:8])
            raise CheckpointError(f"tensor {name!r} is not in {self.info.path} (it has {known}...)")
        saved = getattr(torch, entry["dtype"])
        if dtype is not None and dtype != saved:
            raise CheckpointError(f"tensor {name!r}: target is {dtype}, the checkpoint has {saved}")
        if length is not None and length != entry["length"]:
            raise CheckpointError(
                f"tensor {name!r}: target global length {length}, the checkpoint has "
                f"{entry['length']}"
            )
        return entry

    def read_into(self, name: str, offset: int, shard: torch.Tensor) -> None:
        """Fill `shard` with elements [offset, offset + shard.numel()) of tensor `name`."""
        end = offset + shard.numel()
        if offset < 0 or end > self.tensors[name]["length"]:
            raise CheckpointError(
                f"tensor {name!r}: range [{offset}, {end}) is outside its global length "
                f"{self.tensors[name]['length']}"
            )
        host = shard if shard.device.type == "cpu" and shard.is_contiguous() else None
        host = host if host is not None else torch.empty(shard.numel(), dtype=shard.dtype)
        out = memoryview(host.reshape(-1).view(torch.uint8).numpy())
        item = shard.element_size()
        cursor = offset
        while cursor < end:
            piece = next((p for p in self.pieces[name] if p[0] <= cursor < p[0] + p[1]), None)
            if piece is None:
                raise CheckpointError(f"tensor {name!r}: element {cursor} was saved by no rank")
            start, numel, rank, byte_offset = piece
            stop = min(end, start + numel)
            dest = out[(cursor - offset) * item : (stop - offset) * item]
            self.read_bytes(rank, byte_offset + (cursor - start) * item, dest)
            cursor = stop
        if host is not shard:
            shard.copy_(host.view_as(shard))

    def read_bytes(self, rank: int, byte_offset: int, dest: memoryview) -> None:
        """Copy the saved rank's bytes [byte_offset, +len(dest)) into dest, block by block.

        Whole blocks inside the range are read straight into dest and checked there; only
        the partial blocks at its ends go through a bounce buffer.
        """
        done = 0
        while done < len(dest):
            position = byte_offset + done
            index, within = divmod(position, BLOCK_BYTES)
            size = self._block_size(rank, index)
            if size <= 0:
                raise CorruptCheckpoint(f"{self._name(rank)}: ends before byte {position}")
            if within == 0 and len(dest) - done >= size:
                self._read_block(rank, index, dest[done : done + size])
                done += size
                continue
            if self.cached != (rank, index):
                self.cached = None
                self._read_block(rank, index, memoryview(self.block)[:size])
                self.cached = (rank, index)
            n = min(len(dest) - done, size - within)
            dest[done : done + n] = memoryview(self.block)[within : within + n]
            done += n

    def _block_size(self, rank: int, index: int) -> int:
        return min(BLOCK_BYTES, self.parts[rank]["nbytes"] - index * BLOCK_BYTES)

    def _read_block(self, rank: int, index: int, into: memoryview) -> None:
        """Read block `index` of a saved rank's file into `into` and check its checksum."""
        part = self.parts[rank]
        start = index * BLOCK_BYTES
        try:
            if isinstance(self.info.path, Url):  # one ranged GET of exactly this block
                got = store.read(self.info.path / part["file"], start, start + len(into))
                into[: len(got)] = got
                got = len(got)
            else:
                if rank not in self.files:
                    self.files[rank] = os.open(self.info.path / part["file"], os.O_RDONLY)
                got = os.preadv(self.files[rank], [into], start)
        except FileNotFoundError as e:
            raise CorruptCheckpoint(f"{self._name(rank)} is missing") from e
        self.bytes_read += got
        if got < len(into):
            raise CorruptCheckpoint(f"{self._name(rank)} is truncated at block {index}")
        if zlib.crc32(into) != part["crc32"][index]:
            raise CorruptCheckpoint(f"{self._name(rank)} block {index} fails its checksum")

    def _name(self, rank: int) -> str:
        return str(self.info.path / self.parts[rank]["file"])
