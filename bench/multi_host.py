"""A job on two hosts against the planner's cost model (issue #21: within 0.75..1.25).

    python -m bench.multi_host [--steps 12]

Runs, through the platform on an emulated cluster of two worker hosts (bench.host_cluster:
1 Gbit/s links between the hosts' namespaces), a tiny job on 2 hosts x 2 ranks (strategy NNN)
and takes its median step time (the first step, with its allocations, left out). The
planner predicts the same step (engine.paro.planner.plan) from the compute the job's own `ops`
events measured (a rank's step less collectives and data wait, median rank) and the links:
within a host the tiers this machine's calibration measures (engine.paro.calibrate), between
hosts the emulated link (1 Gbit/s shared by the host's ranks, the calibrated latency). Needs
root. Prints one JSON document; `ratios.two_host_vs_cost_model` is measured / predicted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from bench.host_loss import START_S, platform_on_hosts, tiny_spec
from bench.worker_loss import submit, wait_until
from engine.horing.cost import Links, Tier
from engine.horing.topology import Topology
from engine.moe.config import preset
from engine.paro.calibrate import host_links
from engine.paro.planner import plan

STRATEGY = "NNN"
INTER_GBIT = 1.0


def measured(job) -> dict[str, float]:
    from monitor.models import Event

    later = Event.objects.filter(job=job, step__gt=1)
    return {
        "step_s": statistics.median(e.data["step_time"] for e in later.filter(type="step")),
        "compute_s": statistics.median(
            statistics.median(r["compute_ms"] for r in e.data["ranks"]) / 1e3
            for e in later.filter(type="ops")),
    }


def predicted(spec: dict, compute_s: float, links: Links) -> float:
    p, t = spec["parallel"], spec["train"]
    rows = plan(preset(spec["model"]["preset"]), Topology(p["nodes"], p["procs_per_node"]),
                float("inf"), t.get("grad_accum", 1), links, compute_time_s=compute_s,
                dtype_bytes=4)
    return next(r.step_time_s for r in rows if r.strategy == STRATEGY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    calibrated = host_links()
    spec = tiny_spec("two-hosts", 2, args.steps, 0, strategy=STRATEGY)
    with platform_on_hosts(2) as (_, owner):
        from jobs.models import Job

        job = Job.objects.create(name="two-hosts", owner=owner, spec=spec)
        submit(job.pk)
        wait_until(lambda: Job.objects.get(pk=job.pk).is_terminal, START_S * 3, "the job ends")
        state = Job.objects.get(pk=job.pk).state
        found = measured(job)
    ranks_per_host = spec["parallel"]["procs_per_node"]
    links = Links(intra=Tier(**calibrated["intra"]),
                  inter=Tier(latency_s=calibrated["inter"]["latency_s"],
                             bandwidth=INTER_GBIT * 1e9 / 8 / ranks_per_host))
    prediction = predicted(spec, found["compute_s"], links)
    print(json.dumps({
        "what": "median step of a tiny 2-host x 2-rank job over the planner's prediction "
                "(measured compute, calibrated intra-host links, the emulated inter-host link)",
        "state": state, "measured": found, "predicted_step_s": prediction,
        "links": {"intra": calibrated["intra"], "inter_gbit": INTER_GBIT},
        "ratios": {"two_host_vs_cost_model": round(found["step_s"] / prediction, 3)},
        "target": [0.75, 1.25], "load_avg": os.getloadavg(),
    }, indent=2))


if __name__ == "__main__":
    main()
