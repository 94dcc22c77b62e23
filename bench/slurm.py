"""The Slurm backend beside Ringside's own hosts (issue #35): submit to first step, and what
is stored.

    python -m bench.slurm [--steps 6] [--loss-steps 30]

Starts a platform of this run's own (a private redis-server, DATABASE_URL or a SQLite file),
a real Slurm on two emulated hosts (bench.slurm_cluster: slurmctld in the root namespace, a
slurmd in each host's network namespace, SlurmdTimeout as the report says) and one
`manage.py worker` in the root namespace that is both a Ringside host (4 slots) and the
Slurm login node (RINGSIDE_SLURM_SUBMIT=1). The same tiny job (2 nodes x 2 ranks on one host)
runs on the hosts backend, then on Slurm (one node), side by side in one run; then the 2-node
layout on Slurm. Each time is from the job's creation to its first step event (the engine's
own time); each run's stored losses are checked for every step exactly once. Last, node loss:
the 2-node job (`min_hosts` 1) loses node 1 (its slurmd and ranks killed) past its first
checkpoint; `node_loss_to_first_step_s` is from the kill to the first step the job trains
again (Slurm marks the node down after SlurmdTimeout, the platform submits the job again on
node 0 without it). Needs root and Slurm. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import cluster
from bench.cluster import HostsSpec
from bench.host_loss import tiny_spec
from bench.platform_env import REPO_ROOT  # also puts the platform's packages on the path
from bench.slurm_cluster import SLURMD_TIMEOUT_S, SlurmCluster, missing
from bench.worker_loss import platform_services, submit, wait_until

START_S = 300.0
SUBNET = 232


def run(owner: Any, name: str, backend: str, hosts: int, steps: int,
        lose: SlurmCluster | None = None) -> dict[str, Any]:
    """One job to its end: its submit-to-first-step time and its stored steps; with `lose`,
    node 1 of that cluster dies past the job's first checkpoint."""
    from jobs.models import Job, State
    from monitor.models import Event

    spec = tiny_spec(name, hosts, steps, checkpoint_every=3, min_hosts=1 if lose else hosts)
    job = Job.objects.create(name=name, owner=owner, backend=backend, spec=spec)
    submit(job.pk)
    first = wait_until(lambda: Event.objects.filter(job=job, type="step").order_by("seq").first(),
                       START_S, f"{name}: a first step")
    figures = {"backend": backend, "hosts": hosts,
               "submit_to_first_step_s": round(first.time - job.created_at.timestamp(), 2)}
    if lose is not None:
        figures["node_loss_to_first_step_s"] = node_loss_to_first_step(job, lose)
    wait_until(lambda: Job.objects.get(pk=job.pk).state in (State.COMPLETED, State.FAILED),
               START_S, f"{name}: the end")
    job.refresh_from_db()
    return {**figures, "state": job.state, "lost_or_duplicated_points": lost_or_duplicated(job)}


def node_loss_to_first_step(job: Any, slurm: SlurmCluster) -> float:
    """Kill node 1 once `job` is past its first checkpoint; seconds until it trains again."""
    from monitor.models import Event, MetricPoint

    wait_until(lambda: MetricPoint.objects.filter(job=job, name="loss").count() >= 4, START_S,
               f"{job.name}: step 4")
    killed_at = time.time()
    slurm.kill_node(1)
    step = wait_until(lambda: Event.objects.filter(job=job, type="step", time__gt=killed_at + 1)
                      .order_by("seq").first(), START_S, f"{job.name}: a step after the loss")
    return round(step.time - killed_at, 2)


def lost_or_duplicated(job: Any) -> int:
    """Steps of `job` stored more than once, or never."""
    from monitor.models import MetricPoint

    stored = list(MetricPoint.objects.filter(job=job, name="loss").values_list("step", flat=True))
    steps = job.spec["train"]["steps"]
    return len(stored) - len(set(stored)) + len(set(range(1, steps + 1)) - set(stored))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--loss-steps", type=int, default=30)
    args = parser.parse_args()
    if why := missing():
        raise SystemExit(why)
    os.environ["RINGSIDE_CLUSTER"] = "rsbslurm"
    folder = Path(tempfile.mkdtemp(prefix="rs-bslurm-"))  # short: slurmd's socket paths
    slurm = None
    try:
        with platform_services("slurm") as (processes, owner):
            redis = urlsplit(processes.env["REDIS_URL"])
            slurm = SlurmCluster(cluster.up_hosts(HostsSpec(2, 1.0, SUBNET, (redis.port,))),
                                 folder).start()
            bus = redis._replace(netloc=f"{slurm.spec.gateway(0)}:{redis.port}").geturl()
            processes.env.update(slurm.env)
            processes.start("worker", [
                sys.executable, str(REPO_ROOT / "manage.py"), "worker"], {
                **processes.env, "RINGSIDE_HOST_NAME": processes.host_name("login"),
                "RINGSIDE_SLURM_SUBMIT": "1", "RINGSIDE_SLURM_BUS_URL": bus,
                "WORKER_SLOTS": "4", "RINGSIDE_SLURM_POLL_S": "0.5"})
            from hosts.models import Host

            wait_until(lambda: Host.objects.up().exists(), START_S, "the worker registers")
            runs = [run(owner, "on-hosts", "hosts", 1, args.steps),
                    run(owner, "on-slurm", "slurm", 1, args.steps),
                    run(owner, "on-slurm-2-nodes", "slurm", 2, args.steps),
                    run(owner, "on-slurm-node-lost", "slurm", 2, args.loss_steps, lose=slurm)]
    finally:
        if slurm is not None:
            slurm.stop()
        cluster.down()
        shutil.rmtree(folder, ignore_errors=True)
    hosts_s, slurm_s = runs[0]["submit_to_first_step_s"], runs[1]["submit_to_first_step_s"]
    print(json.dumps({
        "what": "the same tiny job (2 nodes x 2 ranks, one host) from its creation to its first "
                "step on Ringside's hosts backend and on Slurm; then 2 Slurm nodes; then 2 "
                "Slurm nodes, one of them killed mid-run",
        "runs": runs,
        "ratios": {"submit_to_first_step_vs_hosts": round(slurm_s / hosts_s, 3),
                   "node_loss_to_first_step_s": runs[3]["node_loss_to_first_step_s"],
                   "lost_or_duplicated_points": sum(r["lost_or_duplicated_points"]
                                                    for r in runs)},
        "targets": {"submit_to_first_step_vs_hosts": 1.5, "node_loss_to_first_step_s": 60,
                    "lost_or_duplicated_points": 0},
        "settings": {"SlurmdTimeout_s": SLURMD_TIMEOUT_S, "RINGSIDE_SLURM_POLL_S": 0.5},
        "load_avg": os.getloadavg(),
    }, indent=2))


if __name__ == "__main__":
    main()
