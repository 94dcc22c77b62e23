"""Launching the ranks of a job with torch.distributed elastic, and reporting how it ended.

The launcher process publishes the lifecycle (`starting`, then exactly one of `completed`,
`failed` or `cancelled`); rank 0 publishes everything in between. Each lifecycle event is
written through a fresh `EventLog`, so its sequence number follows whatever rank 0 wrote.

A job on several hosts runs one launcher per host, as torchrun does (`Rendezvous`: the c10d
rendezvous at an endpoint on one of them). Whoever placed the hosts numbers them (`--node-rank`:
the platform, Slurm, the user); node 0, on the endpoint's host, is the lead: it alone publishes
the lifecycle, and its ranks come first, so rank 0 runs beside it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import multiprocessing
import os
import shutil
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from engine.checkpoint import list_checkpoints
from engine.checkpoint.replica import replicated
from engine.checkpoint.store import location
from engine.contract import (
    ActionBy,
    ActionEvent,
    ActionName,
    AnomalyEvent,
    AnomalyKind,
    Event,
    ExitCode,
    LogEvent,
    PauseMode,
    StateEvent,
    checkpoint_dir,
    checkpoint_tiers,
    memory_dir,
)
from engine.errors import ConfigError
from engine.ports import free_port
from engine.runtime.commands import Outcome
from engine.runtime.confine import scrub_paths
from engine.runtime.control import ControlChannel
from engine.runtime.events import EventLog
from engine.runtime.rendezvous import Rendezvous
from engine.runtime.spec import JobSpec, layout_on_hosts, parse_spec, with_layout
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
    node_rank: int = 0  # this host's (Rendezvous); the lead's, 0, publishes the lifecycle
    # the fault policy restarted the ranks: they resume from the run's own newest checkpoint
    restarted: bool = False
    # the folders whose paths a failure's message may show (a platform job's run folder and
    # data roots); empty: every path (the engine's own command line, one user's tool)
    visible: tuple[str, ...] = ()

    @property
    def lead(self) -> bool:
        return self.node_rank == 0

    def emit(self, event: Event) -> None:
        if self.visible and isinstance(event, StateEvent) and event.error:
            event = dataclasses.replace(
                event, error=scrub_paths(event.error, self.visible),
                traceback=event.traceback and scrub_paths(event.traceback, self.visible))
        if not self.lead:  # another host's launcher: why it ended, on its console only
            if isinstance(event, StateEvent) and (event.error or event.reason):
                print(f"{event.state}: {event.error or event.reason}", file=sys.stderr)
                if event.traceback:
                    print(event.traceback, file=sys.stderr)
            return
        log = EventLog(self.job, self.events_path, self.bus_url)
        try:
            log.emit(event)
        finally:
            log.close()


def on_hosts(spec: JobSpec, rdzv: Rendezvous) -> JobSpec:
    """The spec as it runs under `rdzv`: its nodes over `max_nodes` hosts (the caller checked
    that they divide). The spec is left as it is when it says so already (the platform's
    case), so a reshard's layout carries the platform's own `min_hosts` back to it."""
    p = spec.parallel
    if p.hosts == rdzv.max_nodes:
        return spec
    parallel = {"hosts": rdzv.max_nodes, "min_hosts": min(p.min_hosts or 1, rdzv.max_nodes)}
    return parse_spec(with_layout(spec.to_dict(), parallel))


def resume_sources(spec: JobSpec, target: RunTarget, restarted: bool) -> list[Path] | None:
    """Where this incarnation of the ranks continues from: the folder the user named, or
    after an automatic restart the run's own checkpoints (memory tier first), if any."""
    directory = checkpoint_dir(spec.checkpoint.dir, target.run_dir)
    tiers = checkpoint_tiers(directory)
    if target.resume_from is not None:
        # the job relaunched on other hosts from its own folder (a lost host): its memory
        # snapshots, replicated between the hosts, may be newer than its disk checkpoints
        own = location(str(target.resume_from)) == location(str(directory))
        return tiers if own and replicated(memory_dir(directory)) else [target.resume_from]
    if restarted or target.restarted:
        if any(list_checkpoints(d) for d in tiers):
            return tiers
    return None


def _number_hosts(node_rank: int) -> None:
    """Number the hosts' ranks in the order of their node ranks, so that the lead's come first:
    rank 0, which publishes the events and reads the commands, runs beside the launcher that
    publishes the lifecycle. (The rendezvous orders the hosts by address; only the order of
    whole hosts changes, and a host that did not meet leaves no gap.)"""
    hosts = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    if hosts == 1:
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    key = f"ringside-node/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store.set(key + os.environ["GROUP_RANK"], str(node_rank))
    ranks = sorted(int(store.get(key + str(group))) for group in range(hosts))
    if len(set(ranks)) < hosts:
        raise ValueError(f"--node-rank: the hosts that met say {ranks}: each needs its own")
    host, local = ranks.index(node_rank), int(os.environ["LOCAL_WORLD_SIZE"])
    os.environ["GROUP_RANK"] = str(host)
    os.environ["RANK"] = str(host * local + int(os.environ["LOCAL_RANK"]))


def _on_rendezvous_world(spec: JobSpec) -> tuple[JobSpec, str | None]:
    """The spec laid out on the hosts the rendezvous gave, if not the spec's (an elastic
    MIN:MAX job that met fewer or more hosts); a note saying so, else None."""
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if world == spec.parallel.world_size:
        return spec, None
    laid = parse_spec(layout_on_hosts(spec.to_dict(), world // local))
    t = laid.train
    return laid, (f"the rendezvous gave {world // local} of {spec.parallel.hosts} hosts: "
                  f"{laid.parallel.nodes} nodes, micro_batch {t.micro_batch}, grad_accum "
                  f"{t.grad_accum} (the global batch kept)")


@record
def run_rank(spec_data: dict, target: RunTarget) -> Outcome:
    """The entry point of every rank (a spawned process with the elastic environment)."""
    _number_hosts(target.node_rank)
    spec, relaid = _on_rendezvous_world(parse_spec(spec_data))
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
            events.emit(AnomalyEvent(step=events.last_step, kind=AnomalyKind.CRASH,
                                     severity="error", rank=None,
                                     evidence={"restart": restarts, "max_restarts": most}))
            events.emit(ActionEvent(step=events.last_step, action=ActionName.RESTART,
                                    anomaly=AnomalyKind.CRASH, by=ActionBy.POLICY,
                                    reason=f"restart {restarts} of at most {most}"))
        if relaid:
            events.emit(LogEvent(step=events.last_step, level="warning", message=relaid))
    try:
        # on another world, the run goes on from its newest checkpoint, resharded
        sources = resume_sources(spec, target, restarted or relaid is not None)
        try:
            trainer = Trainer(spec, target.run_dir, events, sources, control, target.metrics_port)
        except ConfigError as e:
            # every rank finds the same fault in the same spec and data: running them again
            # cannot help, so the run ends here rather than raise (which would restart it)
            return Outcome("failed", 0, reason=str(e))
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


def launch(spec: JobSpec, target: RunTarget, rdzv: Rendezvous = Rendezvous()) -> int:
    """Run this host's ranks of the job to the end; returns the process exit code (on every
    host: their ranks agree on how the run ends, as commands reach all of them)."""
    target = dataclasses.replace(target, node_rank=rdzv.node_rank, visible=(
        (str(target.run_dir), *spec.data.roots) if spec.data.roots else ()))
    spec = on_hosts(spec, rdzv)
    directory = checkpoint_dir(spec.checkpoint.dir, target.run_dir)
    # another host's launcher may already see the lead's first checkpoints in a shared folder
    # (saves that never completed, without a manifest because the run died while writing them,
    # hold nothing to resume and nothing a fresh start could mix with: their files are named
    # by their save)
    if target.lead and target.resume_from is None and any(
            c.good for c in list_checkpoints(directory)):
        raise RunDirInUse(
            f"{directory} already holds checkpoints of an earlier run: resume it with "
            f"--resume {directory}, or start afresh in another --run-dir"
        )
    if target.resume_from is None:  # a memory snapshot left by an earlier job is not ours
        shutil.rmtree(memory_dir(directory), ignore_errors=True)
    target.run_dir.mkdir(parents=True, exist_ok=True)
    target.emit(StateEvent(step=0, state="starting", world_size=spec.parallel.world_size))
    incarnation = 0
    while True:
        try:
            outcome = _launch_once(spec, target, rdzv, incarnation)
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
        incarnation += 1
        if outcome.kind == "restart":
            # the policy's, from the snapshot the ranks just took: not a crash, so it spends
            # none of the crash restarts (`max_restarts`); the ladder bounds these per kind
            target = dataclasses.replace(target, resume_from=None, restarted=True)
            continue
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
    return _ended(outcome, target)


def _ended(outcome: Outcome, target: RunTarget) -> int:
    """Publish how the ranks ended the run; the process exit code that says it."""
    if outcome.kind == "failed":  # a configuration error, never retried
        target.emit(StateEvent(step=outcome.step, state="failed", error=outcome.reason))
        return ExitCode.FAILED
    final = {"completed": ("completed", ExitCode.COMPLETED), "pause": ("paused", ExitCode.PAUSED),
             "cancel": ("cancelled", ExitCode.CANCELLED)}
    state, code = final[outcome.kind]
    target.emit(StateEvent(step=outcome.step, state=state, reason=outcome.reason,
                           mode=PauseMode.COLD if outcome.kind == "pause" else None))
    return code


def _launch_once(spec: JobSpec, target: RunTarget, rdzv: Rendezvous, incarnation: int) -> Outcome:
    """One incarnation of this host's ranks: `spec.parallel.hosts` hosts' worth of ranks
    split evenly, meeting the other hosts' under a run id of the incarnation's own (a
    rendezvous that ended is closed for good) at the endpoint's port + the incarnation (the
    last one's store may still be closing: another host must not join that one)."""
    run_id = rdzv.run_id or target.job
    host, _, port = rdzv.endpoint.rpartition(":")
    endpoint = f"{host}:{int(port) + incarnation}" if port else f"127.0.0.1:{free_port()}"
    # the lead hosts the c10d store; torch guesses it from the endpoint's name, which fails
    # in a network namespace (the addresses are the namespace's, not the host name's)
    lead_hosts = rdzv.max_nodes > 1 and target.lead and not _is_loopback(rdzv.host)
    config = LaunchConfig(
        min_nodes=rdzv.min_nodes,
        max_nodes=rdzv.max_nodes,
        nproc_per_node=spec.parallel.ranks_per_host,
        run_id=f"{run_id}-{incarnation}" if incarnation else run_id,
        role="rank",
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint,
        rdzv_configs={**({"is_host": True} if lead_hosts else {}), **rdzv.configs},
        max_restarts=spec.faults.policy.max_restarts,
        monitor_interval=0.1,
        start_method="forkserver",
        local_addr=rdzv.local_addr,
    )
    multiprocessing.set_forkserver_preload([__name__])
    # by global rank: this host's ranks only; any of them tells how the run ended
    results = elastic_launch(config, run_rank)(spec.to_dict(), target)
    return results[min(results)]


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
