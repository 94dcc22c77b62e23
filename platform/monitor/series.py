"""Reading stored step metrics back as chart series."""

from __future__ import annotations

from typing import Any

from monitor.models import MetricPoint


def job_series(job_id: int, names: list[str] | None = None) -> dict[str, dict[str, list[Any]]]:
    """`{name: {"step": [...], "value": [...]}}` at full resolution, steps ascending."""
    points = MetricPoint.objects.filter(job_id=job_id)
    if names:
        points = points.filter(name__in=names)
    series: dict[str, dict[str, list[Any]]] = {}
    for name, step, value in points.order_by("name", "step").values_list("name", "step", "value"):
        s = series.setdefault(name, {"step": [], "value": []})
        s["step"].append(step)
        s["value"].append(value)
    return series
