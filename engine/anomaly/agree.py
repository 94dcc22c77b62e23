"""Make every rank see the same anomalies, so every rank takes the same decision.

Each step: one all-reduce (MAX) of two numbers, "this rank found something" and its wall
clock. Only when some rank found something do the ranks exchange the anomalies themselves
(with their evidence) in one `all_gather_object`. The result is the same list on every rank,
deduplicated by (kind, rank) and ordered by kind, then rank (global ones last), and the same
`now` for the caps.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from engine.anomaly.anomaly import KINDS, Anomaly


def agree_anomalies(local: list[Anomaly], group: Any = None) -> tuple[list[Anomaly], float]:
    """Collective over `group` (all ranks call it each step); returns (anomalies, now)."""
    now = time.time()
    if not (dist.is_available() and dist.is_initialized()):
        return _canonical(local), now
    flags = torch.tensor([float(bool(local)), now], dtype=torch.float64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    now = flags[1].item()
    if flags[0].item() == 0:
        return [], now
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, local, group=group)
    return _canonical([a for found in everyone for a in found]), now


def _canonical(anomalies: list[Anomaly]) -> list[Anomaly]:
    unique: dict[tuple[str, int | None], Anomaly] = {}
    for a in anomalies:
        unique.setdefault((a.kind, a.rank), a)
    # a kind's anomalies that name a rank come before the global one, so the ladder's
    # decision (taken on the first of each kind) names the rank where it is known
    return sorted(unique.values(), key=lambda a: (KINDS.index(a.kind), a.rank is None,
                                                  a.rank or 0))
