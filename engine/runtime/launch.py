"""Launching the ranks of a job with torch.distributed elastic, and reporting how it ended.

The launcher process publishes the lifecycle (`starting`, then exactly one of `completed`,
`failed` or `cancelled`); rank 0 publishes everything in between. Each lifecycle event is
written through a fresh `EventLog`, so its sequence number follows whatever rank 0 wrote.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from engine.checkpoint import list_checkpoints
from engine.contract import (
    ActionBy,
    ActionEvent,
    AnomalyEvent,
    Event,
    ExitCode,
    PauseMode,
    StateEvent,
    checkpoint_dir,
    checkpoint_tiers,
    memory_dir,
)
from engine.ports import free_port
from engine.runtime.commands import Outcome
from engine.runtime.control import ControlChannel
from engine.runtime.events import EventLog
from engine.runtime.spec import JobSpec, parse_spec, with_layout
from engine.runtime.train import Trainer


class RunDirInUse(RuntimeError):
    """A fresh run would mix its checkpoints with an earlier run's."""


@dataclass
class RunTarget:
    """Where a run's outputs go: its folder, its JSONL event file and, optionally, the bus;
    `resume_from`: a checkpoint folder (or one checkpoint) to continue from."""

    run_dir: Path
    events_path: Path
    job: str
    bus_url: str | None = None
    resume_from: Path | None = None
    metrics_port: int | None = None  # rank 0 serves Prometheus text at /metrics

    def emit(self, event: Event) -> None:
        log = EventLog(self.job, self.events_path, self.bus_url)
        try:
            log.emit(event)
        finally:
            log.close()


def resume_sources(spec: JobSpec, target: RunTarget, restarted: bool) -> list[Path] | None:
    """Where this incarnation of the ranks continues from: the folder the user named, or
    after an automatic restart the run's own checkpoints (memory tier first), if any."""
    if target.resume_from is not None:
        return [target.resume_from]
    if restarted:
        tiers = checkpoint_tiers(checkpoint_dir(spec.checkpoint.dir, target.run_dir))
        if any(list_checkpoints(d) for d in tiers):
            return tiers
    return None


@record
def run_rank(spec_data: dict, target: RunTarget) -> Outcome:
    """The entry point of every rank (a spawned process with the elastic environment)."""
    spec = parse_spec(spec_data)
    rank = int(os.environ.get("RANK", "0"))
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    events = control = None
    if rank == 0:
        events = EventLog(target.job, target.events_path, target.bus_url)
        control = ControlChannel(target.job, target.run_dir, target.bus_url)
        if restarted and not list((target.run_dir / "faults").glob("hang-*.json")):
            # a rank died (a hang leaves its own report): say so before resuming
            restarts = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
            most = spec.faults.policy.max_restarts
            events.emit(AnomalyEvent(step=events.last_step, kind="crash", severity="error",
                                     rank=None,
                                     evidence={"restart": restarts, "max_restarts": most}))
            events.emit(ActionEvent(step=events.last_step, action="restart", anomaly="crash",
                                    by=ActionBy.POLICY,
                                    reason=f"restart {restarts} of at most {most}"))
    try:
        trainer = Trainer(spec, target.run_dir, events, resume_sources(spec, target, restarted),
                          control, target.metrics_port)
        return trainer.fit()
    finally:
        for channel in (events, control):
            if channel is not None:
                channel.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _failure_message(error: ChildFailedError) -> str:
    rank, failure = error.get_first_failure()
    detail = failure.message
    if isinstance(detail, dict):  # the @record error file: {"message": ..., "extraInfo": ...}
        detail = detail.get("message", detail)
    if not detail or detail == "<N/A>":
        detail = f"exit code {failure.exitcode}"
        if failure.exitcode < 0:
            detail = f"killed by signal {signal.Signals(-failure.exitcode).name}"
    return f"rank {rank}: {detail}"


def launch(spec: JobSpec, target: RunTarget) -> int:
    """Run every rank of the job to the end; returns the process exit code."""
    directory = checkpoint_dir(spec.checkpoint.dir, target.run_dir)
    if target.resume_from is None and list_checkpoints(directory):
        raise RunDirInUse(
            f"{directory} already holds checkpoints of an earlier run: resume it with "
            f"--resume {directory}, or start afresh in another --run-dir"
        )
    if target.resume_from is None:  # a memory snapshot left by an earlier job is not ours
        shutil.rmtree(memory_dir(directory), ignore_errors=True)
    target.run_dir.mkdir(parents=True, exist_ok=True)
    target.emit(StateEvent(step=0, state="starting", world_size=spec.parallel.world_size))
    while True:
        try:
            outcome = _launch_once(spec, target)
        except ChildFailedError as e:
            target.emit(StateEvent(step=0, state="failed", error=_failure_message(e)))
            return ExitCode.FAILED
        except (SignalException, KeyboardInterrupt) as e:
            signum = getattr(e, "sigval", signal.SIGINT)
            target.emit(StateEvent(step=0, state="cancelled",
                                   reason=f"signal {signal.Signals(signum).name}"))
            return 128 + int(signum)
        except Exception as e:  # the launcher itself failed: say so rather than vanish
            target.emit(StateEvent(step=0, state="failed", error=f"launcher: {e}",
                                   traceback=traceback.format_exc()))
            return ExitCode.FAILED
        if outcome.kind != "reshard":
            break
        # relaunch on the new layout, loading the checkpoint the old one just wrote; the
        # global batch stays the same, so the loss curve continues as if nothing happened
        world = outcome.parallel["nodes"] * outcome.parallel["procs_per_node"]
        micro_batch = spec.train.micro_batch * spec.parallel.world_size // world
        spec = parse_spec(with_layout(spec.to_dict(), outcome.parallel, micro_batch))
        target = dataclasses.replace(target, resume_from=directory)
        target.emit(StateEvent(step=outcome.step, state="resharding",
                               parallel=outcome.parallel, micro_batch=micro_batch))
    final = {"completed": ("completed", ExitCode.COMPLETED), "pause": ("paused", ExitCode.PAUSED),
             "cancel": ("cancelled", ExitCode.CANCELLED)}
    state, code = final[outcome.kind]
    target.emit(StateEvent(step=outcome.step, state=state, reason=outcome.reason,
                           mode=PauseMode.COLD if outcome.kind == "pause" else None))
    return code


def _launch_once(spec: JobSpec, target: RunTarget) -> Outcome:
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=spec.parallel.world_size,
        run_id=target.job,
        role="rank",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=spec.faults.policy.max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
    )
    return elastic_launch(config, run_rank)(spec.to_dict(), target)[0]
