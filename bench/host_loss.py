"""A lost host to the first step on the survivor, and the host's return to the job grown back
(issue #21: each <= 30 s; no stored point lost or duplicated).

    python -m bench.host_loss [--steps 90] [--checkpoint-every 30] [--memory-every 5]
                              [--skip-overhead]

Starts the platform's parts on an emulated cluster of two worker hosts (bench.host_cluster:
a network namespace per host, 1 Gbit/s links, a real `manage.py worker` in each) against
DATABASE_URL (unset: a SQLite file of the benchmark's own) and a private redis-server, every
beat and timeout at its default. Two trials of a tiny job on 2 hosts x 2 ranks with
`min_hosts` 1: once the host without rank 0 is killed (its worker and its ranks, at once), once
the lead (rank 0, the rendezvous endpoint, the supervisor). Each trial waits for a disk
checkpoint and a memory snapshot more than a memory interval after it, kills the host 3 steps
after that snapshot, measures from the kill to the first step event trained on the survivor
(the engine's own event time) and the steps trained again (the survivor holds the lost host's
memory snapshot as a replica: at most `memory_every`, where a disk checkpoint would cost up to
`checkpoint.every`), starts the host's worker again and measures from the first checkpoint due
after it registered to the first step trained on both hosts again, then checks the stored loss
series holds every step once; `host_loss_phases_s` says where the seconds to the first step
went. Then (unless `--skip-overhead`) the same job twice side by side, replication on and off:
`replica_overhead` is the ratio of their median step times less 1. The memory cost (replica
bytes a rank holds) and the blocking seconds of each memory snapshot are reported too. Needs
root. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench import cluster, host_cluster
from bench.platform_env import REPO_ROOT  # also puts the platform's packages on the path
from bench.worker_loss import TRAINING_ANOMALIES, platform_services, submit, wait_until

TARGET_S = 30.0
START_S = 180.0


def tiny_spec(name: str, hosts: int, steps: int, checkpoint_every: int, memory_every: int = 0,
              replicas: bool = True, **parallel) -> dict:
    """The tiny preset on 2 nodes x 2 ranks, observing training anomalies only."""
    return {"name": name, "model": {"preset": "tiny"},
            "parallel": {"nodes": 2, "procs_per_node": 2, "hosts": hosts, **parallel},
            "train": {"steps": steps, "micro_batch": 2, "seq_len": 64, "eval_every": 0,
                      "threads": 1, "trace_every": 0},
            "checkpoint": {"every": checkpoint_every, "memory_every": memory_every,
                           "replicas": replicas},
            "faults": {"policy": {"actions": {kind: ["observe"] for kind in TRAINING_ANOMALIES}}}}


@contextmanager
def platform_on_hosts(hosts: int, **env: str) -> Iterator[tuple[Any, Any]]:
    """(the cluster of `hosts` registered worker hosts, a user) on services of this run's own;
    everything is stopped and removed afterwards."""
    os.environ.setdefault("RINGSIDE_CLUSTER", "rsbench")
    with platform_services("hosts") as (processes, owner):
        from hosts.models import Host

        made = None
        try:
            made = host_cluster.up(hosts, processes.env, processes.folder, **env)
            names = {h.name for h in made.hosts}
            wait_until(lambda: names <= set(Host.objects.up().values_list("name", flat=True)),
                       START_S, f"the hosts register: {made.log_tail(0)}")
            yield made, owner
        finally:
            for k in range(len(made.hosts) if made is not None else 0):
                made.kill(k)
            cluster.down()  # also what a start that failed half-way left


def _events(job: Any, type: str, after: float) -> Any:
    from monitor.models import Event

    return Event.objects.filter(job=job, type=type, time__gt=after).order_by("seq")


def _first_step_after(job: Any, membership_after: float, grown: bool) -> tuple[Any, Any]:
    """The membership event after `membership_after` (to 2 hosts if `grown`, else to 1) and
    the first step event trained after it."""
    def found() -> tuple[Any, Any] | None:
        for change in _events(job, "membership", membership_after):
            if (len(change.data["hosts_after"]) == 2) == grown:
                step = _events(job, "step", 0).filter(seq__gt=change.seq).first()
                return (change, step) if step is not None else None
        return None
    return wait_until(found, START_S, f"job {job.pk}: a step on {'2' if grown else '1'} host(s)")


def trial(lost: str, made: Any, owner: Any, steps: int, every: int,
          memory_every: int) -> dict[str, Any]:
    from jobs.models import Job, State
    from monitor.models import MetricPoint

    name = f"host-loss-{lost}"
    job = Job.objects.create(name=name, owner=owner,
                             spec=tiny_spec(name, 2, steps, every, memory_every, min_hosts=1))
    submit(job.pk)
    wait_until(lambda: len(Job.objects.get(pk=job.pk).placement) == 2
               and Job.objects.get(pk=job.pk).state == State.RUNNING, START_S, "running")
    # the host goes 3 steps after a memory snapshot, a memory interval past the disk one
    disk = wait_until(lambda: _events(job, "checkpoint", 0).filter(data__tier="disk").first(),
                      START_S, "a disk checkpoint")
    snapshot = wait_until(lambda: _events(job, "checkpoint", 0).filter(
        data__tier="memory", step__gt=disk.step + memory_every).first(), START_S,
        "a memory snapshot")
    wait_until(lambda: _events(job, "step", 0).filter(step__gte=snapshot.step + 3).first(),
               START_S, "3 steps after the memory snapshot")
    lead, other = (r.host.name for r in Job.objects.get(pk=job.pk).placement)
    victim = next(h for h in made.hosts if h.name == (lead if lost == "lead" else other))
    survivor = next(h for h in made.hosts if h is not victim)
    held = _replica_bytes(job, survivor.name)
    made.kill(victim.index)
    killed = time.time()
    lost_at_step = _events(job, "step", 0).filter(time__lt=killed).order_by("-step").first().step
    shrink, first = _first_step_after(job, killed, grown=False)

    made.start(victim.index)
    wait_until(lambda: victim.name in {h.name for h in _up_hosts()}, START_S, "the host returns")
    back = time.time()
    due = wait_until(lambda: _events(job, "checkpoint", back).first(), START_S,
                     "the checkpoint due after the host returned")
    grow, regrown = _first_step_after(job, due.time, grown=True)
    wait_until(lambda: Job.objects.get(pk=job.pk).is_terminal, 600, "the job finishes")
    stored = list(MetricPoint.objects.filter(job=job, name="loss").values_list("step", flat=True))
    return {
        "lost": lost, "host": victim.name, "job": job.pk,
        "state": Job.objects.get(pk=job.pk).state, "lost_at_step": lost_at_step,
        "host_loss_to_first_step_s": round(first.data["time"] - killed, 2),
        "host_loss_phases_s": loss_phases(job, killed, first),
        "load_avg_at_loss": os.getloadavg(),  # on a shared machine, the phases follow it
        "resumed_at_step": first.step, "membership_after_loss": shrink.data,
        "host_loss_steps_lost": lost_at_step - (first.step - 1),
        "disk_checkpoint_step": disk.step, "memory_snapshot_step": snapshot.step,
        "replica_bytes_per_rank": held,
        "memory_snapshot_blocking_s": sorted(
            e.data["blocking_s"] for e in _events(job, "checkpoint", 0)
            .filter(data__tier="memory", time__lt=killed)),
        "host_return_to_scale_up_s": round(regrown.data["time"] - due.data["time"], 2),
        "grown_at_step": regrown.step, "membership_after_return": grow.data,
        "loss_timeline": _timeline(job, killed, first.data["time"]),
        "return_timeline": _timeline(job, due.data["time"], regrown.data["time"]),
        "lost_or_duplicated_points": (len(set(range(1, steps + 1)) ^ set(stored))
                                      + len(stored) - len(set(stored))),
    }


RESUMED = re.compile(r"^resumed at step \d+ from .* in (?P<seconds>[\d.]+) s$")


def loss_phases(job: Any, killed: float, first: Any) -> dict[str, float]:
    """Where the seconds from the kill to the first step went, from the events' times: the
    survivor finds the host silent and requeues the job (`detect`); placement, the worker's
    task and the supervisor up to the engine's launch (`relaunch`: the membership event,
    published just before it); the launcher's interpreter and imports (`engine_start`: its
    `starting` event); the rendezvous, the ranks' start and the model's build (`ranks_start`);
    pooling the replicas and loading the state (`resume`: the seconds its log says); the first
    step (`first_step`)."""
    from jobs.models import JobEvent, State

    requeued = JobEvent.objects.filter(job=job, to_state=State.QUEUED,
                                       time__gt=_when(killed)).first()
    membership = _events(job, "membership", killed).first()
    starting = next(e for e in _events(job, "state", membership.data["time"])
                    if e.data["state"] == "starting")
    resumed = next(e for e in _events(job, "log", starting.data["time"])
                   if RESUMED.match(e.data["message"]))
    resume_s = float(RESUMED.match(resumed.data["message"])["seconds"])
    marks = [("detect", requeued.time.timestamp()), ("relaunch", membership.data["time"]),
             ("engine_start", starting.data["time"]),
             ("ranks_start", resumed.data["time"] - resume_s), ("resume", resumed.data["time"]),
             ("first_step", first.data["time"])]
    since = [killed] + [t for _, t in marks]
    return {name: round(t - before, 2) for (name, t), before in zip(marks, since, strict=False)}


def _when(t: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC)


def _replica_bytes(job: Any, host: str) -> int:
    """Bytes a rank of `host` holds for its peer's: half its host's memory tier (on two hosts
    each holds every rank's part: its own, and the others' replicas) over its ranks."""
    from engine.contract import memory_dir
    from jobs.launch import checkpoint_folder

    tier = memory_dir(checkpoint_folder(job), host)
    parts = sum(f.stat().st_size for f in tier.glob("step-*/*.rank-*") if f.is_file())
    return parts // 2 // 2


def step_times(job: Any, skip: int = 5) -> list[float]:
    return sorted(e.data["step_time"] for e in _events(job, "step", 0).filter(step__gt=skip))


def replica_overhead(owner: Any, steps: int, memory_every: int) -> dict[str, Any]:
    """The same job with replication on and off, side by side on the two hosts (each host
    runs a rank pair of both): their median step times."""
    from jobs.models import Job

    jobs = {}
    for replicas in (True, False):
        name = f"replicas-{'on' if replicas else 'off'}"
        jobs[replicas] = Job.objects.create(name=name, owner=owner, spec=tiny_spec(
            name, 2, steps, 0, memory_every, replicas=replicas))
        submit(jobs[replicas].pk)
    for job in jobs.values():
        wait_until(lambda job=job: Job.objects.get(pk=job.pk).is_terminal, 600,
                   f"job {job.pk} finishes")
    median = {on: statistics.median(step_times(job)) for on, job in jobs.items()}
    return {"step_time_on_s": round(median[True], 4), "step_time_off_s": round(median[False], 4),
            "states": [Job.objects.get(pk=job.pk).state for job in jobs.values()]}


def _timeline(job: Any, start: float, end: float) -> list[tuple[float, str]]:
    """Where the seconds from `start` to `end` went: the job's transitions and the engine's
    state events in between, at their seconds after `start`."""
    from jobs.models import JobEvent

    marks = [(t.time.timestamp(), f"job {t.to_state}: {t.message}"[:100])
             for t in JobEvent.objects.filter(job=job) if start <= t.time.timestamp() <= end]
    marks += [(e.data["time"], f"engine {e.data['state']}")
              for e in _events(job, "state", start) if e.data["time"] <= end]
    return [(round(t - start, 2), what) for t, what in sorted(marks)]


def _up_hosts() -> Any:
    from hosts.models import Host

    return Host.objects.up()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=90)
    parser.add_argument("--checkpoint-every", type=int, default=30)
    parser.add_argument("--memory-every", type=int, default=5)
    parser.add_argument("--skip-overhead", action="store_true",
                        help="no replication on/off runs (the host-loss trials only)")
    args = parser.parse_args()
    with platform_on_hosts(2, WORKER_SLOTS="4") as (made, owner):
        trials = [trial(lost, made, owner, args.steps, args.checkpoint_every, args.memory_every)
                  for lost in ("other", "lead")]
        overhead = (None if args.skip_overhead
                    else replica_overhead(owner, args.steps, args.memory_every))
    from django.conf import settings
    from django.db import connection

    worst_loss = max(t["host_loss_to_first_step_s"] for t in trials)
    worst_return = max(t["host_return_to_scale_up_s"] for t in trials)
    blocking = [s for t in trials for s in t["memory_snapshot_blocking_s"]]
    print(json.dumps({
        "what": "a worker host killed (worker and ranks) to the first step on the survivor; "
                "the host back to the first step on both hosts, from the checkpoint due after "
                "it registered",
        "trials": trials,
        "replica_overhead": overhead,
        "ratios": {"host_loss_to_first_step_s": worst_loss,
                   "host_loss_steps_lost": max(t["host_loss_steps_lost"] for t in trials),
                   "memory_every": args.memory_every,
                   **({"replica_overhead": round(
                       overhead["step_time_on_s"] / overhead["step_time_off_s"] - 1, 3)}
                      if overhead else {}),
                   "replica_bytes_per_rank": max(t["replica_bytes_per_rank"] for t in trials),
                   "memory_snapshot_blocking_s_median": round(statistics.median(blocking), 4),
                   "memory_snapshot_blocking_s_max": round(max(blocking), 4),
                   "host_return_to_scale_up_s": worst_return,
                   "lost_or_duplicated_points": sum(t["lost_or_duplicated_points"]
                                                    for t in trials),
                   "host_loss_vs_target": round(worst_loss / TARGET_S, 3),
                   "host_return_vs_target": round(worst_return / TARGET_S, 3)},
        "target_s": TARGET_S,
        "settings": {name: getattr(settings, name) for name in (
            "HOST_BEAT_S", "HOST_LOST_AFTER_S", "PART_BEAT_S", "PART_SILENT_AFTER_S",
            "JOB_HEARTBEAT_S")} | {"database": connection.vendor, "repo": str(REPO_ROOT),
                                   "inter_gbit": made.spec.inter_gbit},
        "load_avg": os.getloadavg(),
    }, indent=2))


if __name__ == "__main__":
    main()
