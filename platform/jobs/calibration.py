"""The planner's compute time: one rank's forward+backward of a micro-batch, from what the
platform knows, best source first:

1. measured: the `ops` events of a job with the same model (preset and overrides) on the same
   kind of device; a rank's compute (its step less collectives and data wait) gives the
   device's training FLOP/s, which prices any batch and layout of that model;
2. calibrated: the model's FLOPs per token (engine.moe.config.flops_per_token) over this
   host's training rate, measured once by the `calibrate` task (`python -m
   engine.paro.calibrate` in a child of a worker: torch never loads in a web process) and
   kept in `RUNS_DIR/calibration.json`; the first request sends the task;
3. unknown: no number, and the reason.

Communication is priced on the links that calibration measured too, once there are some;
between hosts (`parallel.hosts` > 1) on the link a multi-host job measured: the bus bandwidth
of its collectives over the hosts' rail (latency included, so priced with none of its own),
else within-host figures, and the table says which.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import shared_task
from django.conf import settings
from django.core.cache import cache

from engine.paro.planner import (
    Links,
    PlanRow,
    Tier,
    Topology,
    compute_time_s,
    effective_flops_per_s,
    merge_equivalent,
    plan,
    ranks_per_device,
)
from engine.runtime.spec import JobSpec, parse_spec
from jobs.models import Job, State
from jobs.telemetry import telemetry

# steps of a measured job that price its device; its first step is warm-up, not kept
MEASURED_STEPS = 20
_PENDING = "jobs.calibration.pending"


@dataclass(frozen=True)
class Compute:
    time_s: float | None  # one rank's forward+backward of one micro-batch
    source: str


@dataclass(frozen=True)
class Priced:
    """The links communication is priced on, and where the one between hosts came from."""

    links: Links
    source: str


def calibration_path() -> Path:
    return settings.RUNS_DIR / "calibration.json"


def host_calibration() -> dict | None:
    """{"device", "flops_per_s", "links"} of this host, or None before the task stored it."""
    try:
        return json.loads(calibration_path().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@shared_task(name="jobs.calibration.calibrate")
def calibrate() -> dict:
    """Measure this host (engine.paro.calibrate, in a child process) and store the result."""
    try:
        done = subprocess.run([sys.executable, "-m", "engine.paro.calibrate"], check=True,
                              capture_output=True, text=True, timeout=600,
                              cwd=settings.REPO_ROOT)
        found = json.loads(done.stdout.splitlines()[-1])
        path = calibration_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(found))
        tmp.replace(path)
    finally:
        cache.delete(_PENDING)  # a failed one may be sent again
    return found


def _links(host: dict | None, default: Links) -> Links:
    if host is None or "links" not in host:
        return default
    return Links(**{tier: Tier(**t) for tier, t in host["links"].items()})


def predict(spec: JobSpec, budget_bytes: float,
            links: Links) -> tuple[list[PlanRow], Compute, Priced]:
    """The planner's rows for `spec`'s model, batch and layout on this host's device (the
    engine's dtype there: fp32 on CPU, bf16 on GPU) and its measured links (else `links`),
    strategies that coincide merged."""
    host = host_calibration()
    device = (host or {}).get("device", "cpu")
    compute = estimate(spec, device, host)
    priced = price_links(spec, _links(host, links))
    p, t = spec.parallel, spec.train
    topology = Topology(p.nodes, p.procs_per_node)
    rows = plan(spec.model, topology, budget_bytes, t.grad_accum, priced.links,
                compute_time_s=compute.time_s or 0.0, dtype_bytes=4 if device == "cpu" else 2,
                collective=p.collective)
    return merge_equivalent(rows, topology), compute, priced


def price_links(spec: JobSpec, host_links: Links) -> Priced:
    """`host_links` with, for a job on several hosts, the inter-host link measured."""
    if spec.parallel.hosts == 1:
        return Priced(host_links, "between nodes: this host's")
    measured = _measured_inter_link()
    if measured is None:
        return Priced(host_links, "between hosts: unknown until a job runs on several hosts; "
                                  "priced as within this host")
    job_id, tier = measured
    return Priced(Links(host_links.intra, tier),
                  f"between hosts: {tier.bandwidth * 8 / 1e9:.2f} Gbit/s, measured: job {job_id}")


def _measured_inter_link() -> tuple[int, Tier] | None:
    """(job id, the link) from the newest job on several hosts that timed collectives over
    the hosts' rail: their bus bytes over their time, median over its recent steps."""
    jobs = (Job.objects.filter(spec__parallel__hosts__gt=1).exclude(state=State.QUEUED)
            .order_by("-pk"))
    for job in jobs[:10]:
        rates = [rate for ops in _recent_ops(job) if (rate := _rail_bytes_per_s(ops))]
        if rates:
            return job.pk, Tier(latency_s=0.0, bandwidth=statistics.median(rates))
    return None


def _rail_bytes_per_s(ops_event: dict) -> float | None:
    rail = [op for op in ops_event.get("ops", {}).values()
            if op.get("kind") == "collective" and op.get("group") == "inter"]
    seconds = sum(op["median_ms"] for op in rail) / 1e3
    bus_bytes = sum(op["busbw_gbps"] * 1e9 / 8 * op["median_ms"] / 1e3 for op in rail)
    return bus_bytes / seconds if seconds > 0 and bus_bytes > 0 else None


def estimate(spec: JobSpec, device: str, host: dict | None) -> Compute:
    """One rank's micro-batch compute for `spec`'s model, batch and layout on `device`, from a
    measured job, else the `host` calibration."""
    t, world = spec.train, spec.parallel.world_size
    sharing = ranks_per_device(world, device)
    measured = _measured_rate(spec, device)
    if measured is not None:
        job_id, rate = measured
        return Compute(compute_time_s(spec.model, t.seq_len, t.micro_batch, rate, sharing),
                       f"measured: job {job_id}")
    if host is not None and host["device"] == device:
        rate = host["flops_per_s"]
        return Compute(compute_time_s(spec.model, t.seq_len, t.micro_batch, rate, sharing),
                       f"calibrated training rate {rate / 1e9:.0f} GFLOP/s")
    if host is None and cache.add(_PENDING, True, timeout=600):
        calibrate.delay()
    reason = "calibrating this host" if host is None else f"no calibration for {device}"
    return Compute(None, f"unknown: no measured job with this model on {device}; {reason}")


def _measured_rate(spec: JobSpec, device: str) -> tuple[int, float] | None:
    """(job id, the device's training FLOP/s) from the newest job with the same model that
    reported op timings on `device`."""
    model = spec.to_dict()["model"]
    jobs = Job.objects.filter(spec__model=model).exclude(state=State.QUEUED).order_by("-pk")
    for job in jobs[:10]:
        if _device(job) != device:
            continue
        compute = _compute_s(job)
        if compute is None:
            continue
        ran = parse_spec(job.spec)
        t = ran.train
        sharing = ranks_per_device(ran.parallel.world_size, device)
        tokens = t.micro_batch * t.seq_len * t.grad_accum
        return job.pk, effective_flops_per_s(ran.model, t.seq_len, tokens, compute, sharing)
    return None


def _device(job: Job) -> str | None:
    states = reversed(telemetry().events_data(job.pk, "state"))  # the newest first
    return next((s["device"] for s in states if s.get("device")), None)


def _compute_s(job: Job) -> float | None:
    """The median over recent steps of the median rank's compute, seconds."""
    steps = [statistics.median(r["compute_ms"] for r in ops["ranks"])
             for ops in _recent_ops(job) if ops.get("ranks")]
    return statistics.median(steps) / 1e3 if steps else None


def _recent_ops(job: Job) -> list[dict[str, Any]]:
    """The job's `ops` events of its last MEASURED_STEPS steps (its first, warm-up, left out)."""
    return telemetry().recent_ops(job.pk, MEASURED_STEPS)
