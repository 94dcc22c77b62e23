"""The run's checkpoints: saves announced as `checkpoint` events, resume from a folder, and
the in-process rollback that policy and commands share."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from engine.checkpoint import Checkpointer, CheckpointReader, inspect, list_checkpoints, restore
from engine.checkpoint.layout import MANIFEST, abandon_newer, step_dir_name
from engine.checkpoint.lookup import find
from engine.checkpoint.replica import ReplicaRing, gather, replicated
from engine.checkpoint.store import Location, exists, location
from engine.contract import (
    AnomalyEvent,
    AnomalyKind,
    CheckpointEvent,
    CheckpointTier,
    Event,
    LogEvent,
)
from engine.paro import ShardedDataParallel
from engine.runtime.commands import CommandRefused
from engine.runtime.lineage import Lineage, Parent
from engine.runtime.state import TrainState
from engine.xputimer import OpTimer


class TrainCheckpoints:
    """Every rank's; `ckpt` carries `state` as its "train" part, the shards come from `dp`.
    On several `hosts` (their ranks numbered host by host) with `replicas`, every memory
    snapshot is also held by the next host (`engine.checkpoint.replica`)."""

    def __init__(self, ckpt: Checkpointer, dp: ShardedDataParallel, state: TrainState,
                 timer: OpTimer, emit: Callable[[Event], None], lineage: Lineage,
                 hosts: int = 1, replicas: bool = False):
        self.ckpt, self.dp, self.state, self.timer, self.emit = ckpt, dp, state, timer, emit
        self.lineage = lineage
        state.settings.checkpointer = ckpt  # a `set` of checkpoint.* changes its schedule
        self.ranks_per_host = ckpt.world_size // hosts
        self.ring: ReplicaRing | None = None
        if replicas and hosts > 1 and ckpt.memory_dir is not None:
            self.ring = ReplicaRing(ckpt.memory_dir, ckpt.rank, ckpt.world_size,
                                    self.ranks_per_host, ckpt.memory_keep)
            ckpt.on_memory_part = self.ring.send
        if ckpt.every or ckpt.memory_every:
            mine = [t for t, _, _ in dp.sharded_state().values()]
            ckpt.reserve(sum(t.numel() * t.element_size() for t in mine),
                         pinned=any(t.is_cuda for t in mine))

    def save(self, to_disk: bool = True) -> Location:
        shards = self.dp.sharded_state()
        lineage = self.lineage.record(self.state.step, self.state.source_tokens)
        with self.timer.op("checkpoint", kind="host"):  # the blocking part: the copy to host
            blocking_s = self.ckpt.save(self.state.step, shards, to_disk=to_disk,
                                        meta={"lineage": lineage})
        directory = self.ckpt.directory if to_disk else self.ckpt.memory_dir
        path = directory / step_dir_name(self.state.step)
        self.emit(CheckpointEvent(
            step=self.state.step, path=str(path),
            tier=CheckpointTier.DISK if to_disk else CheckpointTier.MEMORY, blocking_s=blocking_s,
            size_bytes=sum(length * t.element_size() for t, _, length in shards.values()),
            strategy=self.ckpt.meta["strategy"], world_size=self.ckpt.world_size,
            lineage=lineage,
        ))
        return path

    def save_if_due(self) -> None:
        tier = self.ckpt.due(self.state.step)
        if tier is not None:
            self.save(to_disk=tier == CheckpointTier.DISK)

    def save_final(self) -> None:
        """A finished run always leaves its final state on disk."""
        if self.ckpt.due(self.state.step) != CheckpointTier.DISK:
            self.save()

    def persist(self) -> None:
        """Wait until every rank's queued checkpoints are on disk (before this run exits)."""
        self.ckpt.wait()
        dist.barrier()

    def load(self, reader: CheckpointReader, kind: str | None = None) -> None:
        """Take the whole training state from an open checkpoint (any layout); the timeline
        continues from it, as `kind` says (by default "resume" from this run's own tiers,
        else "clone")."""
        self.dp.load_sharded_state(reader.read)
        self.ckpt.load_parts(reader)
        info = reader.info
        self.lineage.descend(Parent(kind or self._resume_kind(info.path), str(info.path),
                                    info.step, info.meta.get("lineage")))

    def _resume_kind(self, path: Location) -> str:
        """"resume" for a checkpoint in this run's own tiers, else "clone" (another job's)."""
        return "resume" if _folder_of(path) in {_folder_of(t / "x") for t in self.ckpt.tiers} \
            else "clone"

    def resume(self, sources: list[str | os.PathLike[str]]) -> None:
        """Continue from the newest good checkpoint in `sources` (folders of checkpoints, or
        one checkpoint folder; local paths or URLs); corrupt ones are skipped, each with an
        anomaly event."""
        started = time.perf_counter()
        sources = self._whole_memory_checkpoint([location(s) for s in sources])
        if len(sources) == 1 and exists(sources[0] / MANIFEST):
            with CheckpointReader(inspect(sources[0])) as reader:
                self.load(reader)
            path = sources[0]
        else:
            restored = restore(sources, self.load)
            for bad in restored.skipped:
                self.emit(AnomalyEvent(step=self.state.step, kind=AnomalyKind.CHECKPOINT_CORRUPT,
                                       severity="warning", rank=None,
                                       evidence={"path": str(bad.path), "problem": bad.problem}))
            if restored.checkpoint is None:
                raise FileNotFoundError(
                    f"resume: no good checkpoint in {', '.join(str(d) for d in sources)}"
                )
            path = restored.checkpoint.path
        memory = self.ckpt.memory_dir
        if memory is not None and replicated(memory):
            # snapshots past this step are of an abandoned timeline: never pieced together
            # with a returning host's later (abandon_newer on every host, as forget_after)
            abandon_newer(memory, self.state.step)
        # the seconds say what a relaunch spent finding, pooling and loading its state
        # (bench.host_loss splits a lost host's recovery with them)
        self.emit(LogEvent(step=self.state.step, level="info", message=(
            f"resumed at step {self.state.step} from {path} in "
            f"{time.perf_counter() - started:.2f} s")))

    def _whole_memory_checkpoint(self, sources: list[Location]) -> list[Location]:
        """On several hosts each memory tier holds its own host's parts and its ring
        predecessor's: where any rank resumes from its memory tier, the ranks make the newest
        memory checkpoint newer than the disk's whole on every host and resume from it (or,
        where there is none, from the other sources): the same choice on every rank."""
        memory = self.ckpt.memory_dir
        if self.ranks_per_host == self.ckpt.world_size or not _any_rank(memory in sources):
            return sources
        others = [s for s in sources if s != memory]
        newest = [info.step for d in others for info in list_checkpoints(d) if info.good]
        whole = gather(memory, self.ckpt.rank, self.ckpt.world_size, self.ranks_per_host,
                       max(newest, default=-1))
        return [whole] if whole is not None else others

    def rollback(self, step: int | None, name: str | None, skip_data: bool,
                 keep_settings: bool = True) -> dict:
        """Go back to a kept checkpoint in-process: the one named, or the newest at or before
        `step`. With skip_data the loader keeps its position, so the window between that
        checkpoint and now is not trained on again; with keep_settings the live settings
        stay as they are now, else they are the checkpoint's."""
        self.ckpt.wait()
        dist.barrier()
        target = find(self.ckpt.tiers, step=step, name=name)
        if target is None:
            raise CommandRefused(f"rollback: no good checkpoint matches {name or step}")
        state = self.state
        from_step, position = state.step, state.loader.position
        # the live ladder remembers the rollbacks and retries just taken, which the older
        # checkpoint does not: only the detectors go back
        ladder, settings = state.faults.ladder.state_dict(), state.settings.state_dict()
        with CheckpointReader(target) as reader:
            self.load(reader, kind="rollback")
        state.faults.ladder.load_state_dict(ladder)
        if keep_settings:
            state.settings.load_state_dict(settings)
        state.settings.record()  # the changes in force now, kept or the checkpoint's
        if skip_data:
            state.loader.position = position
        self.ckpt.forget_after(state.step)
        # no rank saves the new timeline's first checkpoint while another still deletes the
        # abandoned one's folders (a folder of the same step would be deleted under it)
        dist.barrier()
        return {"checkpoint": str(target.path), "to_step": state.step, "from_step": from_step,
                "skip_data": skip_data, "settings": "kept" if keep_settings else "restored"}

    def close(self, drop_memory_tier: bool = False) -> None:
        if drop_memory_tier:  # the memory tier is shared: no rank drops it while one writes
            self.persist()
        self.ckpt.close(drop_memory_tier=drop_memory_tier)
        if self.ring is not None:
            self.ring.close()


def _any_rank(flag: bool) -> bool:
    value = torch.tensor([int(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _folder_of(path: Location) -> str:
    """The folder holding `path`, spelled alike for a local path (resolved) and a URL."""
    return str(path.resolve().parent) if isinstance(path, Path) else str(path).rpartition("/")[0]
