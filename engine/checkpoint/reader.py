"""Loading with resharding: each rank reads exactly the byte ranges it needs.

A checkpoint saved under any world size and layout loads into any other: for every wanted
range of a tensor the reader finds the saved shards that overlap it and reads those bytes
(whole 4 MiB blocks, whose checksums it checks) from the saved ranks' files, never a whole
file unless the range spans it. Locally a block is one pread; in an object store (an
`s3://` checkpoint directory) each block is one ranged GET.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy
import torch
import torch.distributed as dist

from engine.checkpoint import store
from engine.checkpoint.layout import (
    BLOCK_BYTES,
    MANIFEST,
    CheckpointError,
    CheckpointInfo,
    CorruptCheckpoint,
    crc32,
    find_latest_good,
    inspect,
    list_checkpoints,
)
from engine.checkpoint.staging import advise_huge_pages
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
    """Reads checksum-checked ranges of one checkpoint's tensors from the saved ranks' files.

    Only the 4 MiB blocks that hold a wanted range are read, each checked against its
    checksum: a block the target wants whole is read straight into it (one pread, no copy
    in user space), any other through a bounce buffer. An object store's file is fetched
    block by block (one ranged GET each). The blocks of one `fill()` are shared among a few
    threads (pread and the checksum release the GIL), so a load keeps the disk or the page
    cache busy. (Mapping the files instead measured slower here: the page faults and the
    unmapping cost more than pread's copy.)
    """

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
        self.bytes_read = 0  # fetched from the files, all ranks (what a ranged load costs)
        self.files: dict[int, int] = {}  # rank -> open fd (local files)
        self._lock = threading.Lock()
        self._local = threading.local()  # each loading thread's bounce buffer
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown()
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
        copies, staged = [], []
        for name, value in targets.items():
            if not (isinstance(value, tuple) and len(value) == 3):
                raise TypeError(f"targets[{name!r}] must be (shard, global_offset, global_length)")
            shard, offset, length = value
            self.check(name, shard.dtype, length)
            host = _host_buffer(shard)
            copies += self._copies(name, offset, host)
            staged.append((shard, host))
        self._copy(copies)
        for shard, host in staged:
            _give_back(host, shard)

    def read_into(self, name: str, offset: int, shard: torch.Tensor) -> None:
        """Fill `shard` with elements [offset, offset + shard.numel()) of tensor `name`."""
        host = _host_buffer(shard)
        self._copy(self._copies(name, offset, host))
        _give_back(host, shard)

    def extras(self, rank: int) -> Any:
        """The extras object that saved `rank` passed to `save()`."""
        if rank not in self.parts:
            raise CheckpointError(
                f"rank {rank} is not in {self.info.path}: it was saved by "
                f"{self.info.world_size} ranks"
            )
        extras = self.parts[rank]["extras"]
        buffer = torch.empty(extras["nbytes"], dtype=torch.uint8)
        self._copy([(rank, extras["byte_offset"], buffer)])
        return pickle.loads(buffer.numpy().tobytes())

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

    def _copies(self, name: str, offset: int, host: torch.Tensor) -> list[_Copy]:
        """(saved rank, byte offset in its file, destination bytes) that fill `host` (a flat
        CPU tensor) with elements [offset, offset + host.numel()) of tensor `name`."""
        end = offset + host.numel()
        if offset < 0 or end > self.tensors[name]["length"]:
            raise CheckpointError(
                f"tensor {name!r}: range [{offset}, {end}) is outside its global length "
                f"{self.tensors[name]['length']}"
            )
        out = host.view(torch.uint8)
        item = host.element_size()
        copies, cursor = [], offset
        while cursor < end:
            piece = next((p for p in self.pieces[name] if p[0] <= cursor < p[0] + p[1]), None)
            if piece is None:
                raise CheckpointError(f"tensor {name!r}: element {cursor} was saved by no rank")
            start, numel, rank, byte_offset = piece
            stop = min(end, start + numel)
            dest = out[(cursor - offset) * item : (stop - offset) * item]
            copies.append((rank, byte_offset + (cursor - start) * item, dest))
            cursor = stop
        return copies

    def _copy(self, copies: list[_Copy]) -> None:
        """Carry out the copies block by block: each block is fetched and checked once, then
        every piece of it that a copy wants goes to its destination."""
        blocks: dict[tuple[int, int], list[tuple[int, torch.Tensor]]] = {}
        for rank, byte_offset, dest in copies:
            done = 0
            while done < dest.numel():
                index, within = divmod(byte_offset + done, BLOCK_BYTES)
                n = min(dest.numel() - done, BLOCK_BYTES - within)
                blocks.setdefault((rank, index), []).append((within, dest[done : done + n]))
                done += n
        if len(blocks) <= 1:
            for (rank, index), pieces in blocks.items():
                self._copy_block(rank, index, pieces)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="checkpoint-load")
        for done in [self._pool.submit(self._copy_block, rank, index, pieces)
                     for (rank, index), pieces in blocks.items()]:
            done.result()

    def _copy_block(self, rank: int, index: int, pieces: list[tuple[int, torch.Tensor]]) -> None:
        """Read and check block `index` of a saved rank's file: straight into the target when
        the target wants the whole block, else into this thread's bounce buffer, from which
        every wanted piece is copied out."""
        size = min(BLOCK_BYTES, self.parts[rank]["nbytes"] - index * BLOCK_BYTES)
        if size <= 0:
            raise CorruptCheckpoint(f"{self._name(rank)}: ends before byte {index * BLOCK_BYTES}")
        (within, dest), *more = pieces
        if not more and within == 0 and dest.numel() == size:
            self._read_block(rank, index, memoryview(dest.numpy()))
            return
        if not hasattr(self._local, "bounce"):
            self._local.bounce = numpy.empty(BLOCK_BYTES, numpy.uint8)
        bounce = self._local.bounce[:size]
        self._read_block(rank, index, memoryview(bounce))
        for within, dest in pieces:
            dest.numpy()[:] = bounce[within : within + dest.numel()]

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
                got = os.preadv(self._file(rank), [into], start)
        except FileNotFoundError as e:
            raise CorruptCheckpoint(f"{self._name(rank)} is missing") from e
        with self._lock:
            self.bytes_read += got
        if got < len(into):
            raise CorruptCheckpoint(f"{self._name(rank)} is truncated at block {index}")
        if crc32(into) != part["crc32"][index]:
            raise CorruptCheckpoint(f"{self._name(rank)} block {index} fails its checksum")

    def _file(self, rank: int) -> int:
        with self._lock:
            if rank not in self.files:
                self.files[rank] = os.open(self.info.path / self.parts[rank]["file"], os.O_RDONLY)
            return self.files[rank]

    def _name(self, rank: int) -> str:
        return str(self.info.path / self.parts[rank]["file"])


# (saved rank, byte offset in its file, destination: a flat uint8 CPU tensor)
_Copy = tuple[int, int, torch.Tensor]
_WORKERS = min(4, os.cpu_count() or 1)


def _host_buffer(shard: torch.Tensor) -> torch.Tensor:
    """A flat view of `shard` when a load can write into it directly; else a flat CPU
    staging tensor (for a GPU shard, a non-contiguous one) that `_give_back` copies in. Its
    pages are asked to be huge: a load writes every byte, and where they are fresh memory
    (a buffer allocated for the load) 4 KiB pages cost the load most of its time."""
    if shard.device.type == "cpu" and shard.is_contiguous():
        host = shard.view(-1)
    else:
        host = torch.empty(shard.numel(), dtype=shard.dtype)
    advise_huge_pages(host)
    return host


def _give_back(host: torch.Tensor, shard: torch.Tensor) -> None:
    if host.data_ptr() != shard.data_ptr() or host.device != shard.device:
        shard.copy_(host.view_as(shard))
