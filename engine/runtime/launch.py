"""Launching the ranks of a job with torch.distributed elastic, and reporting how it ended.

The launcher process publishes the lifecycle (`starting`, then exactly one of `completed`,
`failed` or `cancelled`); rank 0 publishes everything in between. Each lifecycle event is
written through a fresh `EventLog`, so its sequence number follows whatever rank 0 wrote.
"""

from __future__ import annotations

import os
import signal
import socket
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from engine.runtime.events import EventLog
from engine.runtime.spec import JobSpec, parse_spec
from engine.runtime.train import Trainer

EXIT_COMPLETED = 0
EXIT_FAILED = 1


@dataclass
class RunTarget:
    """Where a run's outputs go: its folder, its JSONL event file and, optionally, the bus."""

    run_dir: Path
    events_path: Path
    job: str
    bus_url: str | None = None

    def emit(self, type: str, step: int, **fields: object) -> None:
        log = EventLog(self.job, self.events_path, self.bus_url)
        try:
            log.emit(type, step, **fields)
        finally:
            log.close()


@record
def run_rank(spec_data: dict, target: RunTarget) -> None:
    """The entry point of every rank (a spawned process with the elastic environment)."""
    spec = parse_spec(spec_data)
    rank = int(os.environ.get("RANK", "0"))
    events = EventLog(target.job, target.events_path, target.bus_url) if rank == 0 else None
    try:
        Trainer(spec, target.run_dir, events).fit()
    finally:
        if events is not None:
            events.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    target.run_dir.mkdir(parents=True, exist_ok=True)
    target.emit("state", 0, state="starting", world_size=spec.parallel.world_size)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=spec.parallel.world_size,
        run_id=target.job,
        role="rank",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{_free_port()}",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    try:
        elastic_launch(config, run_rank)(spec.to_dict(), target)
    except ChildFailedError as e:
        target.emit("state", 0, state="failed", error=_failure_message(e))
        return EXIT_FAILED
    except (SignalException, KeyboardInterrupt) as e:
        signum = getattr(e, "sigval", signal.SIGINT)
        target.emit("state", 0, state="cancelled", reason=f"signal {signal.Signals(signum).name}")
        return 128 + int(signum)
    except Exception as e:  # the launcher itself failed: say so rather than vanish
        target.emit("state", 0, state="failed", error=f"launcher: {e}",
                    traceback=traceback.format_exc())
        return EXIT_FAILED
    target.emit("state", spec.train.steps, state="completed")
    return EXIT_COMPLETED
