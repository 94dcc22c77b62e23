"""A lost host to the first step on the survivor, and the host's return to the job grown back
(issue #21: each <= 30 s; no stored point lost or duplicated).

    python -m bench.host_loss [--steps 90] [--checkpoint-every 10]

Starts the platform's parts on an emulated cluster of two worker hosts (bench.host_cluster:
a network namespace per host, 1 Gbit/s links, a real `manage.py worker` in each) against
DATABASE_URL (unset: a SQLite file of the benchmark's own) and a private redis-server, every
beat and timeout at its default. Two trials of a tiny job on 2 hosts x 2 ranks with
`min_hosts` 1: once the host without rank 0 is killed (its worker and its ranks, at once), once
the lead (rank 0, the rendezvous endpoint, the supervisor). Each trial waits for a checkpoint
written whole, kills the host, measures from the kill to the first step event trained on the
survivor (the engine's own event time), starts the host's worker again and measures from the
first checkpoint due after it registered to the first step trained on both hosts again, then
checks the stored loss series holds every step once. Needs root. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench import cluster, host_cluster
from bench.platform_env import REPO_ROOT  # also puts the platform's packages on the path
from bench.worker_loss import TRAINING_ANOMALIES, platform_services, submit, wait_until

TARGET_S = 30.0
START_S = 180.0


def tiny_spec(name: str, hosts: int, steps: int, checkpoint_every: int, **parallel) -> dict:
    """The tiny preset on 2 nodes x 2 ranks, observing training anomalies only."""
    return {"name": name, "model": {"preset": "tiny"},
            "parallel": {"nodes": 2, "procs_per_node": 2, "hosts": hosts, **parallel},
            "train": {"steps": steps, "micro_batch": 2, "seq_len": 64, "eval_every": 0,
                      "threads": 1, "trace_every": 0},
            "checkpoint": {"every": checkpoint_every},
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


def trial(lost: str, made: Any, owner: Any, steps: int, every: int) -> dict[str, Any]:
    from engine.checkpoint import find_latest_good
    from jobs.launch import checkpoint_folder
    from jobs.models import Job, State
    from monitor.models import MetricPoint

    name = f"host-loss-{lost}"
    job = Job.objects.create(name=name, owner=owner,
                             spec=tiny_spec(name, 2, steps, every, min_hosts=1))
    submit(job.pk)
    wait_until(lambda: len(Job.objects.get(pk=job.pk).placement) == 2
               and Job.objects.get(pk=job.pk).state == State.RUNNING, START_S, "running")
    wait_until(lambda: find_latest_good(checkpoint_folder(job))[0], START_S, "a checkpoint")
    lead, other = (r.host.name for r in Job.objects.get(pk=job.pk).placement)
    victim = next(h for h in made.hosts if h.name == (lead if lost == "lead" else other))
    lost_at_step = Job.objects.get(pk=job.pk).step
    made.kill(victim.index)
    killed = time.time()
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
        "resumed_at_step": first.step, "membership_after_loss": shrink.data,
        "host_return_to_scale_up_s": round(regrown.data["time"] - due.data["time"], 2),
        "grown_at_step": regrown.step, "membership_after_return": grow.data,
        "loss_timeline": _timeline(job, killed, first.data["time"]),
        "return_timeline": _timeline(job, due.data["time"], regrown.data["time"]),
        "lost_or_duplicated_points": (len(set(range(1, steps + 1)) ^ set(stored))
                                      + len(stored) - len(set(stored))),
    }


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
    parser.add_argument("--checkpoint-every", type=int, default=10)
    args = parser.parse_args()
    with platform_on_hosts(2) as (made, owner):
        trials = [trial(lost, made, owner, args.steps, args.checkpoint_every)
                  for lost in ("other", "lead")]
    from django.conf import settings
    from django.db import connection

    worst_loss = max(t["host_loss_to_first_step_s"] for t in trials)
    worst_return = max(t["host_return_to_scale_up_s"] for t in trials)
    print(json.dumps({
        "what": "a worker host killed (worker and ranks) to the first step on the survivor; "
                "the host back to the first step on both hosts, from the checkpoint due after "
                "it registered",
        "trials": trials,
        "ratios": {"host_loss_to_first_step_s": worst_loss,
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
