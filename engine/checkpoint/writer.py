"""Flash checkpoints: a save blocks only for a copy into host memory; a thread persists it.

Every rank calls `save()` at the same step with what it owns. The blocking part copies the
shards (and the pickled extras) into a reusable host staging buffer (pinned when the shards
live on a GPU) and queues it; a background thread puts the buffer in the memory tier (a
folder in /dev/shm, which survives the process, so a restarted rank on the same host resumes
from it: a hard link to the buffer's own file where `staging` could give it one, else a copy)
and, for disk saves, writes it to the checkpoint directory, then commits. Two staging buffers
let one save persist while the next one copies; a third save waits for the first to finish.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import queue
import re
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from engine import contract
from engine.checkpoint import shardfile, store
from engine.checkpoint.layout import (
    BLOCK_BYTES,
    FORMAT_VERSION,
    MANIFEST,
    PINNED,
    CheckpointError,
    abandon_newer,
    apply_retention,
    block_crcs,
    data_file_name,
    part_file_name,
    step_dir_name,
)
from engine.checkpoint.staging import Staging
from engine.checkpoint.store import Location, Url

if TYPE_CHECKING:
    from engine.checkpoint.reader import CheckpointReader

# name -> (local flat shard, global element offset, global length), as
# ShardedDataParallel.sharded_state() returns; a replicated tensor is (t, 0, t.numel()).
ShardedState = dict[str, tuple[torch.Tensor, int, int]]

_STAGING_BUFFERS = 2


class Stateful(Protocol):
    """A part of the training state that a checkpoint carries in its extras."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class _Job:
    step: int
    save_id: str
    staging: Staging
    nbytes: int
    shards: list[dict[str, Any]]
    extras: dict[str, int]
    to_disk: bool
    meta: dict[str, Any]
    time: float


class Checkpointer:
    """Saves this rank's shards of a sharded state; one per rank, created on every rank.

    directory: the disk tier (`checkpoint.dir`: a folder, or a URL such as
    `s3://bucket/prefix`). memory_dir: the memory tier (always a local folder), "auto" for
    `engine.contract.memory_dir(directory)`, None to have none. keep / memory_keep: how many newest
    good checkpoints each tier keeps besides pinned ones. every / memory_every: the schedule
    `due()` reads (`checkpoint.every` and `checkpoint.memory_every`; 0 = never). meta: JSON
    facts stored in every manifest (strategy, nodes, procs_per_node...). run_id: a string
    equal on all ranks of this incarnation of the job; by default rank 0 draws one and
    broadcasts it over `group` (a collective), or draws it alone when the world is 1.
    parts: the stateful parts of the training state besides the shards (name -> an object
    with `state_dict()` / `load_state_dict()`), saved as the extras and loaded by
    `load_parts()`. mirror_disk_saves: whether a disk save is also written to the memory tier
    (the engine's runs keep a memory tier for the policy's restart snapshots, and mirror only
    where memory snapshots are scheduled: a copy of every disk save costs host memory).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | Url,
        *,
        rank: int = 0,
        world_size: int = 1,
        keep: int = 3,
        memory_dir: str | os.PathLike[str] | None = "auto",
        memory_keep: int = 2,
        every: int = 0,
        memory_every: int = 0,
        meta: dict[str, Any] | None = None,
        run_id: str | None = None,
        group: Any = None,
        parts: dict[str, Stateful] | None = None,
        mirror_disk_saves: bool = True,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        for name, value, least in (("keep", keep, 1), ("memory_keep", memory_keep, 1),
                                   ("every", every, 0), ("memory_every", memory_every, 0)):
            if value < least:
                raise ValueError(f"{name} must be >= {least}, got {value}")
        self.directory: Location = store.location(directory)
        if memory_dir == "auto":
            memory_dir = contract.memory_dir(str(self.directory))
        self.memory_dir = Path(memory_dir) if memory_dir is not None else None
        self.rank, self.world_size = rank, world_size
        self.keep, self.memory_keep = keep, memory_keep
        self.every, self.memory_every = every, memory_every
        self.mirror_disk_saves = mirror_disk_saves
        self.meta = dict(meta or {})
        self.parts = dict(parts or {})
        self.run_id = run_id or _agree_on_run_id(world_size, group)
        self.saves = 0
        self.last_blocking_s = 0.0
        # called on a persist thread with (step, save_id) once this rank's part of a save is
        # in the memory tier (engine.checkpoint.replica sends it to another host from there)
        self.on_memory_part: Callable[[int, str], None] | None = None
        self._free: list[Staging] = []
        self._allocated = 0
        self._buffers = threading.Condition()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(
            target=self._persist_loop, name=f"checkpoint-persist-r{rank}", daemon=True
        )
        self._thread.start()
        # a clean interpreter exit flushes pending saves (daemon threads still run in atexit)
        atexit.register(_close_if_alive, weakref.ref(self))

    def set_schedule(self, every: int, keep: int, memory_every: int) -> None:
        """A new schedule and retention from now on (validated by the caller); a memory
        schedule on a checkpointer without the memory tier opens the default one."""
        self.every, self.keep, self.memory_every = every, keep, memory_every
        if memory_every > 0 and self.memory_dir is None:
            self.memory_dir = contract.memory_dir(str(self.directory))

    def due(self, step: int) -> contract.CheckpointTier | None:
        """Which save the schedule asks for at `step`, if any."""
        if self.every > 0 and step % self.every == 0:
            return contract.CheckpointTier.DISK
        if self.memory_dir is not None and self.memory_every > 0 and step % self.memory_every == 0:
            return contract.CheckpointTier.MEMORY
        return None

    @property
    def tiers(self) -> list[Location]:
        """Where this checkpointer's checkpoints are, fastest first."""
        return [d for d in (self.memory_dir, self.directory) if d is not None]

    def save(
        self, step: int, tensors: ShardedState, extras: Any = None, *, to_disk: bool = True,
        meta: dict[str, Any] | None = None,
    ) -> float:
        """Snapshot this rank's shards and extras for `step`; returns the seconds it blocked.

        Collective in the sense that every rank must make the same sequence of save calls
        (same steps, same `to_disk`). The shards may be changed as soon as this returns.
        `extras` is any picklable object of this rank (step, schedule, data position, RNG
        states, detector state), by default `{name: part.state_dict()}` of the `parts`;
        `to_disk=False` writes the memory tier only; `meta`, facts of this save alone (its
        lineage), joins the checkpointer's in the manifest.
        """
        started = time.perf_counter()
        self._raise_if_failed()
        if self._closed:
            raise CheckpointError("save() after close()")
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if not to_disk and self.memory_dir is None:
            raise CheckpointError("to_disk=False needs a memory tier, but memory_dir is None")
        if extras is None and self.parts:
            extras = {name: part.state_dict() for name, part in self.parts.items()}
        shards = _plan(tensors)
        extras_bytes = pickle.dumps(extras, protocol=pickle.HIGHEST_PROTOCOL)
        header, offsets, total = shardfile.layout(
            {entry["name"]: tensors[entry["name"]][0] for entry in shards}, len(extras_bytes),
            {"step": str(step), "rank": str(self.rank), "world_size": str(self.world_size),
             "shards": json.dumps({e["name"]: [e["offset"], e["length"]] for e in shards})},
        )
        on_gpu = any(t.is_cuda for t, _, _ in tensors.values())
        buffer = self._acquire(total, pinned=on_gpu)
        staging = buffer.take(total)
        staging[: len(header)].copy_(torch.frombuffer(bytearray(header), dtype=torch.uint8))
        for entry in shards:
            entry["byte_offset"] = offsets[entry["name"]]
            source = tensors[entry["name"]][0].detach().reshape(-1)
            end = entry["byte_offset"] + source.numel() * source.element_size()
            staging[entry["byte_offset"] : end].view(source.dtype).copy_(source, non_blocking=True)
        extras_at = offsets[shardfile.EXTRAS]
        staging[extras_at:total].copy_(torch.frombuffer(bytearray(extras_bytes), dtype=torch.uint8))
        if on_gpu:
            torch.cuda.synchronize()
        self.saves += 1
        self._jobs.put(
            _Job(
                step=step,
                save_id=f"{self.run_id}-{self.saves:06d}",
                staging=buffer,
                nbytes=total,
                shards=shards,
                extras={"byte_offset": extras_at, "nbytes": len(extras_bytes)},
                to_disk=to_disk,
                meta={**self.meta, **(meta or {})},
                time=time.time(),
            )
        )
        self.last_blocking_s = time.perf_counter() - started
        return self.last_blocking_s

    def load_parts(self, reader: CheckpointReader) -> None:
        """Give every part its state from an open checkpoint's extras (saved rank 0's: the
        parts hold only facts every rank shares)."""
        extras = reader.extras(0)
        if len(self.parts) == 1 and not set(self.parts) & set(extras):
            # written before checkpoints held named parts: the extras are the one part's state
            extras = {name: extras for name in self.parts}
        for name, part in self.parts.items():
            part.load_state_dict(extras[name])

    def wait(self) -> None:
        """Block until every queued save of this rank is persisted; raise if one failed.

        A checkpoint is committed once all ranks' parts are in, so a loop that needs it to
        exist everywhere (pause, reshard) calls wait() on every rank, then a barrier.
        """
        self._jobs.join()
        self._raise_if_failed()

    def close(self, drop_memory_tier: bool = False) -> None:
        """Flush and stop the persist thread (clean shutdown). `drop_memory_tier=True` also
        frees the memory tier's RAM, for a job that completed (the disk tier stays)."""
        if not self._closed:
            self._closed = True
            self._jobs.join()
            self._jobs.put(None)
            self._thread.join()
            with self._buffers:
                for staging in self._free:
                    staging.close()
                self._free.clear()
        if drop_memory_tier and self.memory_dir is not None:
            shutil.rmtree(self.memory_dir, ignore_errors=True)
        self._raise_if_failed()

    def forget_after(self, step: int) -> None:
        """After a rollback to `step`: take both tiers' later checkpoints out of reach (see
        `abandon_newer`) so that a restart cannot resume the abandoned timeline. Call on every
        rank (idempotent)."""
        self.wait()
        for directory in (self.memory_dir, self.directory):
            if directory is not None:
                abandon_newer(directory, step)

    @property
    def pending(self) -> int:
        """Saves queued or being written by this rank."""
        return self._jobs.unfinished_tasks

    def _acquire(self, nbytes: int, pinned: bool) -> Staging:
        """A free staging buffer that fits; else a new one while fewer than two are staging
        (a free buffer whose file is now a memory-tier checkpoint's costs no memory of its
        own and waits for retention to drop that checkpoint; one too small is let go);
        else wait for one."""
        with self._buffers:
            while True:
                held = [b for b in self._free if not b.reusable]
                for b in held[: max(0, len(held) - self.memory_keep)]:  # e.g. pinned
                    self._drop(b)
                spare = [b for b in self._free if b.reusable]
                fitting = [b for b in spare if b.capacity >= nbytes]
                if fitting:
                    self._free.remove(fitting[0])
                    return fitting[0]
                if spare:
                    self._drop(spare[0])
                waiting = sum(b not in spare for b in self._free)  # on retention
                if self._allocated - waiting < _STAGING_BUFFERS:
                    self._allocated += 1
                    return Staging(nbytes, pinned, self.memory_dir)
                self._buffers.wait()

    def _drop(self, staging: Staging) -> None:
        self._free.remove(staging)
        staging.close()
        self._allocated -= 1

    def _release(self, staging: Staging) -> None:
        with self._buffers:
            if self._closed and not self._thread.is_alive():  # a reservation done too late
                staging.close()
                return
            self._free.append(staging)
            self._buffers.notify()

    def _raise_if_failed(self) -> None:
        """Raise a background failure once; later saves are still attempted (a full disk may
        have been cleared), and a checkpoint that failed simply never gets its manifest."""
        error, self._error = self._error, None
        if error is not None:
            raise CheckpointError(f"a background checkpoint write failed: {error!r}") from error

    def _persist_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._persist(job)
            except Exception as e:  # raised to the caller by the next save(), wait() or close()
                self._error = self._error or e
            finally:
                self._release(job.staging)
            try:
                self._stage_ahead(job)
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def reserve(self, nbytes: int, pinned: bool) -> None:
        """Make the first save's staging buffer (its tensors' `nbytes`; `pinned` for GPU
        shards) now, on a thread of its own, while the run builds and takes its first steps:
        made in the save, it was a stall of seconds for a large state or on a busy host."""
        threading.Thread(target=self._stage, args=(nbytes, pinned),
                         name=f"checkpoint-reserve-r{self.rank}", daemon=True).start()

    def _stage_ahead(self, job: _Job) -> None:
        """When a save's buffer became its memory-tier file, make the next save's buffer now,
        here rather than in the next save: a blocking copy into fresh memory costs several
        times one into memory that is ready."""
        if not job.staging.reusable:
            self._stage(job.nbytes, pinned=False)

    def _stage(self, nbytes: int, pinned: bool) -> None:
        """A new free buffer of `nbytes`, unless one is free to take already or enough are
        made; a failure is raised by the next save."""
        with self._buffers:
            waiting = sum(not b.reusable for b in self._free)
            if (self._closed or len(self._free) > waiting
                    or self._allocated - waiting >= _STAGING_BUFFERS):
                return
            self._allocated += 1
        try:
            staging = Staging(nbytes, pinned=pinned, folder=self.memory_dir)
        except Exception as e:
            with self._buffers:
                self._allocated -= 1
            self._error = self._error or e
            return
        self._release(staging)

    def _persist(self, job: _Job) -> None:
        """Write the staged file to each tier on a thread of its own while this thread
        checksums it (the writes and the CRC release the GIL); each tier's thread commits
        its checkpoint (and drops the ones retention no longer keeps) once its file and the
        checksums are in, independently of the other tier."""
        data = memoryview(job.staging.memory[: job.nbytes].numpy())
        tiers: list[tuple[contract.CheckpointTier, Location, int]] = []
        if self.memory_dir is not None and (self.mirror_disk_saves or not job.to_disk):
            tiers.append((contract.CheckpointTier.MEMORY, self.memory_dir, self.memory_keep))
        if job.to_disk:
            tiers.append((contract.CheckpointTier.DISK, self.directory, self.keep))
        crcs: list[int] = []
        checksummed = threading.Event()

        def persist_tier(tier: contract.CheckpointTier, directory: Location, keep: int) -> None:
            step_dir = directory / step_dir_name(job.step)
            store.make_folder(step_dir)
            file = step_dir / data_file_name(job.save_id, self.rank)
            if tier == contract.CheckpointTier.MEMORY and job.staging.file_backed:
                job.staging.link(file)
            else:
                store.write_buffer(file, data, job.save_id)
            checksummed.wait()
            if len(crcs) * BLOCK_BYTES >= len(data):  # else the checksumming failed
                self._commit(job, crcs, directory, keep)

        writes = [_Background(f"{self._thread.name}-{tier}", persist_tier, tier, directory, keep)
                  for tier, directory, keep in tiers]
        try:
            crcs.extend(block_crcs(data))
        finally:
            checksummed.set()
            failures = [w.failure() for w in writes]  # every write ends before the staging
        for failure in failures:                      # buffer goes back
            if failure is not None:
                raise failure

    def _commit(self, job: _Job, crcs: list[int], directory: Location, keep: int) -> None:
        """Write this rank's part file; commit the checkpoint if it completes it."""
        part = {
            "format": FORMAT_VERSION,
            "step": job.step,
            "save_id": job.save_id,
            "rank": self.rank,
            "world_size": self.world_size,
            "file": data_file_name(job.save_id, self.rank),
            "nbytes": job.nbytes,
            "crc32": crcs,
            "shards": job.shards,
            "extras": job.extras,
            "meta": job.meta,
            "time": job.time,
        }
        step_dir = directory / step_dir_name(job.step)
        store.write(step_dir / part_file_name(job.save_id, self.rank),
                    [json.dumps(part).encode()], job.save_id)
        store.sync_folder(step_dir)
        if _commit_if_complete(step_dir, job.save_id, self.world_size, self.rank):
            apply_retention(directory, keep, job.step)
        if directory == self.memory_dir and self.on_memory_part is not None:
            self.on_memory_part(job.step, job.save_id)


class _Background(threading.Thread):
    """`fn(*args)` on its own thread; `failure()` waits for it and returns what it raised."""

    def __init__(self, name: str, fn: Callable[..., None], *args: Any) -> None:
        super().__init__(name=name, daemon=True)
        self.fn, self.args = fn, args
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.fn(*self.args)
        except BaseException as e:  # handed to the persist thread by failure()
            self.error = e

    def failure(self) -> BaseException | None:
        self.join()
        return self.error


def _plan(tensors: ShardedState) -> list[dict[str, Any]]:
    """Check the sharded state; each shard's entry of the part (its byte offset comes from
    `shardfile.layout`)."""
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict name -> (shard, offset, length), got {tensors!r}")
    shards = []
    for name in sorted(tensors):
        value = tensors[name]
        if not isinstance(name, str) or not name or name == shardfile.EXTRAS:
            raise ValueError(f"tensor names must be non-empty strings other than "
                             f"{shardfile.EXTRAS!r}, got {name!r}")
        if not (isinstance(value, tuple) and len(value) == 3):
            raise TypeError(f"tensors[{name!r}] must be (shard, global_offset, global_length)")
        shard, global_offset, length = value
        if not isinstance(shard, torch.Tensor):
            raise TypeError(f"tensors[{name!r}][0] must be a tensor, got {type(shard).__name__}")
        if not 0 <= global_offset <= global_offset + shard.numel() <= length:
            raise ValueError(
                f"tensors[{name!r}]: shard of {shard.numel()} elements at offset "
                f"{global_offset} does not fit in a global length of {length}"
            )
        shards.append(
            {
                "name": name,
                "dtype": str(shard.dtype).removeprefix("torch."),
                "length": int(length),
                "offset": int(global_offset),
                "numel": shard.numel(),
            }
        )
    return shards


def _commit_if_complete(step_dir: Location, save_id: str, world_size: int, rank: int) -> bool:
    """Write the manifest if every rank's part of this save is in; True if this rank did.

    Whoever sees all parts commits; two ranks committing at once write identical manifests.
    Each rank lists after its own part is written (and an object store lists what was written
    before, as S3 does since 2020), so the last rank to finish always sees every part.
    """
    part_files = sorted(p for p in store.children(step_dir)
                        if fnmatch(p.name, f"{save_id}.rank-*.json"))
    if len(part_files) < world_size:
        return False
    parts = [json.loads(store.read(p)) for p in part_files]
    first = parts[0]
    manifest = {
        "format": FORMAT_VERSION,
        "step": first["step"],
        "save_id": save_id,
        "world_size": world_size,
        "meta": first["meta"],
        "time": first["time"],
        "tensors": _tensor_index(parts),
        "parts": [{k: p[k] for k in ("rank", "file", "nbytes", "crc32", "shards", "extras")}
                  for p in parts],
    }
    # a temp of this thread's own: a rank's persist thread and its replica receiver may both
    # commit the same folder at once (identical manifests; the last replace stands)
    store.write(step_dir / MANIFEST, [json.dumps(manifest).encode()],
                f"{save_id}.{rank}.{threading.get_native_id()}")
    store.sync_folder(step_dir)
    for f in store.children(step_dir):
        if _superseded(f.name, save_id):
            store.delete(f)
    return True


def _superseded(name: str, save_id: str) -> bool:
    """Whether a file in a step folder belongs to a save older than `save_id`: one of an earlier
    incarnation of the job (a re-save after a rollback or a restart, a crashed write's temp) or
    an earlier save of this one. A later save of this incarnation at the same step (a scheduled
    save, then a command's) may already be writing into the folder: its files stay."""
    if name in (MANIFEST, PINNED):
        return False
    run_id, _, count = save_id.rpartition("-")
    # data, part and temp files: [.][MANIFEST.json.]<run_id>-<count>.<rest>
    found = re.match(rf"^\.?(?:{re.escape(MANIFEST)}\.)?{re.escape(run_id)}-(\d+)\.", name)
    return found is None or int(found.group(1)) < int(count)


def _tensor_index(parts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """name -> dtype and global length; checks that the ranks agree and cover every tensor."""
    index: dict[str, dict[str, Any]] = {}
    pieces: dict[str, list[tuple[int, int]]] = {}
    for part in parts:
        for s in part["shards"]:
            entry = index.setdefault(s["name"], {"dtype": s["dtype"], "length": s["length"]})
            if (entry["dtype"], entry["length"]) != (s["dtype"], s["length"]):
                raise CheckpointError(
                    f"tensor {s['name']!r}: rank {part['rank']} saved {s['dtype']}[{s['length']}]"
                    f", another rank {entry['dtype']}[{entry['length']}]"
                )
            pieces.setdefault(s["name"], []).append((s["offset"], s["offset"] + s["numel"]))
    for name, spans in pieces.items():
        covered = 0
        for start, end in sorted(spans):
            if start > covered:
                break
            covered = max(covered, end)
        if covered < index[name]["length"]:
            raise CheckpointError(
                f"tensor {name!r}: no rank saved elements [{covered}, ...) of "
                f"{index[name]['length']}; a replicated tensor must be saved by one rank"
            )
    return index


def _agree_on_run_id(world_size: int, group: Any) -> str:
    run_id = [uuid.uuid4().hex[:12]]
    if world_size > 1:
        if not dist.is_initialized():
            raise CheckpointError(
                "world_size > 1 needs torch.distributed initialised (to agree on a run id) "
                "or an explicit run_id equal on all ranks"
            )
        dist.broadcast_object_list(run_id, src=dist.get_global_rank(group, 0) if group else 0,
                                   group=group)
    return run_id[0]


def _close_if_alive(ref: weakref.ref[Checkpointer]) -> None:
    ckpt = ref()
    if ckpt is not None:
        ckpt.close()
