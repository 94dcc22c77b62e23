"""Reading stored telemetry back for charts, downsampled on the server so that extremes survive.

Metric series are cut into at most `max_points` buckets of equal step width; each bucket gives
its first step, the mean value and the min/max envelope, so a one-step spike in a million-step
run still shows in `max`. A window holding no more than `max_points` steps is returned exactly
(min = max = value). A bucket holding a NaN/inf step (stored as null) reports a null value, so
a divergence stays visible as a gap even when the bucket's finite values look normal.

Per-step documents (op timings, expert loads) are thinned the same way, keeping from each bucket
the step with the largest `extreme` (the slowest step, the most imbalanced routing).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from django.db.models import Avg, Count, ExpressionWrapper, F, IntegerField, Max, Min, QuerySet

from monitor.models import Event, ExpertLoad, MetricPoint, OpsSample

DEFAULT_MAX_POINTS = 1000
MAX_POINTS_LIMIT = 20_000

Series = dict[str, dict[str, list[Any]]]


def _window(rows: QuerySet, start: int | None, end: int | None) -> QuerySet:
    if start is not None:
        rows = rows.filter(step__gte=start)
    if end is not None:
        rows = rows.filter(step__lte=end)
    return rows


def _bucket_width(lo: int, hi: int, max_points: int) -> int:
    return max(1, math.ceil((hi - lo + 1) / max_points))


def metric_series(job_id: int, names: Iterable[str] | None = None, start: int | None = None,
                  end: int | None = None, max_points: int = DEFAULT_MAX_POINTS) -> Series:
    """`{name: {"step", "value", "min", "max"}}` for steps in [start, end], steps ascending,
    at most `max_points` points per series."""
    points = _window(MetricPoint.objects.filter(job_id=job_id), start, end)
    names = list(names or [])
    if names:
        points = points.filter(name__in=names)
    extent = {name: (n, lo, hi) for name, n, lo, hi in points.values_list("name").annotate(
        Count("id"), Min("step"), Max("step")).order_by("name")}
    series: Series = {name: {"step": [], "value": [], "min": [], "max": []} for name in extent}
    exact = [name for name, (n, _, _) in extent.items() if n <= max_points]
    coarse = [name for name in extent if name not in exact]
    for name, step, value in (points.filter(name__in=exact).order_by("name", "step")
                              .values_list("name", "step", "value")):
        s = series[name]
        s["step"].append(step)
        s["value"].append(value)
        s["min"].append(value)
        s["max"].append(value)
    if coarse:
        # one bucket grid for every downsampled series, so their points line up on the chart
        lo = start if start is not None else min(extent[n][1] for n in coarse)
        hi = end if end is not None else max(extent[n][2] for n in coarse)
        width = _bucket_width(lo, hi, max_points)
        buckets = (points.filter(name__in=coarse)
                   .annotate(bucket=ExpressionWrapper((F("step") - lo) / width,
                                                      output_field=IntegerField()))
                   .values("name", "bucket")
                   .annotate(first=Min("step"), mean=Avg("value"), low=Min("value"),
                             high=Max("value"), n=Count("id"), finite=Count("value"))
                   .order_by("name", "bucket"))
        for b in buckets:
            s = series[b["name"]]
            s["step"].append(b["first"])
            s["value"].append(b["mean"] if b["finite"] == b["n"] else None)
            s["min"].append(b["low"])
            s["max"].append(b["high"])
    return series


def _thinned(rows: QuerySet, extreme: str, start: int | None, end: int | None,
             max_points: int) -> list[int]:
    """Primary keys of at most `max_points` rows in [start, end]: all of them when they fit,
    else the one with the largest `extreme` in each step bucket."""
    rows = _window(rows, start, end)
    keys = list(rows.order_by("step").values_list("pk", "step", extreme))
    if len(keys) <= max_points:
        return [pk for pk, _, _ in keys]
    lo, hi = keys[0][1], keys[-1][1]
    width = _bucket_width(lo, hi, max_points)
    best: dict[int, tuple[float, int]] = {}
    for pk, step, value in keys:
        bucket = (step - lo) // width
        score = -math.inf if value is None else value
        if bucket not in best or score > best[bucket][0]:
            best[bucket] = (score, pk)
    return [pk for _, pk in best.values()]


def _payloads(job_id: int, seqs: list[int]) -> dict[int, dict[str, Any]]:
    """The data of the job's events with these sequence numbers (the typed rows' payloads)."""
    return dict(Event.objects.filter(job_id=job_id, seq__in=seqs).values_list("seq", "data"))


def ops_sample(job_id: int, step: int | None = None) -> dict[str, Any] | None:
    """The per-op timing of `step` (default: the latest step that has one), or None."""
    rows = OpsSample.objects.filter(job_id=job_id)
    row = (rows.filter(step=step) if step is not None else rows.order_by("-step")).first()
    if row is None:
        return None
    data = _payloads(job_id, [row.seq]).get(row.seq, {})
    return {"step": row.step, "seq": row.seq, "step_ms": row.step_ms,
            "void_share": row.void_share, "data_wait_share": row.data_wait_share,
            "ops": data.get("ops", {}), "ranks": data.get("ranks", [])}


def ops_history(job_id: int, start: int | None = None, end: int | None = None,
                max_points: int = 200) -> dict[str, Any]:
    """Per-op time per step, `{"step": [...], "step_ms": [...], "ops": {op: {"kind",
    "total_ms": [...], "max_ms": [...], "slowest_rank": [...]}}}`; thinned keeping the slowest
    step of each bucket. An op absent from a step reads as null there."""
    rows = OpsSample.objects.filter(job_id=job_id)
    chosen = OpsSample.objects.filter(pk__in=_thinned(rows, "step_ms", start, end, max_points))
    samples = list(chosen.order_by("step").values_list("step", "step_ms", "seq"))
    payloads = _payloads(job_id, [seq for _, _, seq in samples])
    history: dict[str, Any] = {"step": [s for s, _, _ in samples],
                               "step_ms": [ms for _, ms, _ in samples], "ops": {}}
    for i, (_, _, seq) in enumerate(samples):
        for name, op in payloads.get(seq, {}).get("ops", {}).items():
            entry = history["ops"].setdefault(name, {
                "kind": op.get("kind", ""), "total_ms": [None] * len(samples),
                "max_ms": [None] * len(samples), "slowest_rank": [None] * len(samples)})
            for field in ("total_ms", "max_ms", "slowest_rank"):
                entry[field][i] = op.get(field)
    return history


def expert_history(job_id: int, start: int | None = None, end: int | None = None,
                   max_points: int = 200) -> list[dict[str, Any]]:
    """Expert load per step, `[{"step", "max_violation", "dead_experts", "tokens_per_expert":
    [[tokens of each expert] per layer]}]`, thinned keeping the most imbalanced step of each
    bucket."""
    rows = ExpertLoad.objects.filter(job_id=job_id)
    chosen = ExpertLoad.objects.filter(pk__in=_thinned(rows, "max_violation", start, end,
                                                      max_points))
    rows = list(chosen.order_by("step"))
    payloads = _payloads(job_id, [row.seq for row in rows])
    return [{"step": row.step, "max_violation": row.max_violation,
             "dead_experts": row.dead_experts,
             "tokens_per_expert": [layer.get("tokens_per_expert", [])
                                   for layer in payloads.get(row.seq, {}).get("layers", [])]}
            for row in rows]



# What the job page's op charts read of each kept step: per-op totals, and for collectives
# their group, bytes and bandwidth. Per-rank times and medians only for the last steps (the
# rank heatmap averages the last 10): 17 KB an event for `tiny` on two ranks, 5 KB without.
_OP_KEYS = ("kind", "total_ms", "group", "bytes", "busbw_gbps")


def _newest_events(rows: QuerySet, job_id: int, keep: int,
                   up_to: int | None) -> list[dict[str, Any]]:
    """The events of the newest `keep` steps of `rows` (one per step) up to step `up_to` (if
    given), oldest first."""
    rows = rows.filter(job_id=job_id)
    if up_to is not None:
        rows = rows.filter(step__lte=up_to)
    seqs = list(rows.order_by("-step").values_list("seq", flat=True)[:keep])
    payloads = _payloads(job_id, seqs)
    return [payloads[seq] for seq in reversed(seqs) if seq in payloads]


def ops_recent(job_id: int, keep: int, full: int,
               up_to: int | None = None) -> list[dict[str, Any]]:
    """The newest `keep` steps' `ops` events up to step `up_to` (the live branch's: a
    rollback's abandoned steps are kept until trained again), oldest first, as the job page
    charts them: the newest `full` complete, the older ones without per-rank times."""
    events = _newest_events(OpsSample.objects, job_id, keep, up_to)
    cut = len(events) - full
    return [event if i >= cut else _without_ranks(event) for i, event in enumerate(events)]


def experts_recent(job_id: int, keep: int, up_to: int | None = None) -> list[dict[str, Any]]:
    """The newest `keep` steps' `experts` events up to step `up_to`, oldest first."""
    return _newest_events(ExpertLoad.objects, job_id, keep, up_to)


def _without_ranks(event: dict[str, Any]) -> dict[str, Any]:
    ops = {name: {k: op[k] for k in _OP_KEYS if k in op}
           for name, op in event.get("ops", {}).items()}
    return {**event, "ops": ops}
