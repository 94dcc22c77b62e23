"""Cross-rank aggregation of step timings into the body of one `ops` event.

Each step every rank contributes one fixed-size float64 row: a few per-rank numbers, its
system metrics (CPU %, memory: see system.py) and five numbers per op, in an op order all
ranks agree on. One `all_gather` of those rows is the whole per-step exchange. Op names
travel only when some rank has a name the agreed list lacks (the first steps, or a new op):
then ranks exchange names and metadata once with `all_gather_object` and repeat the gather.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch
import torch.distributed as dist

from engine.xputimer.timer import OpStats, StepTimings

_RANK_FIELDS = ("new_names", "step_ms", "compute_ms", "comm_ms", "data_ms", "void_share",
                "cpu_wait_ms")
_OP_FIELDS = ("count", "total_ms", "max_call_ms", "work", "bus_bytes")


def to_us(ms: float) -> float:
    """A time in ms rounded to the microsecond, as `ops` events carry it: no timer here
    resolves finer, and an event (published, stored and streamed every step: some 70 ops x 4
    ranks for `tiny` on 2x2) is a third smaller without the 17-digit floats."""
    return round(ms, 3)


def to_ppm(share: float) -> float:
    """A share of the step rounded to a millionth (a microsecond of a one-second step)."""
    return round(share, 6)


class OpAggregator:
    """Call `aggregate(timings)` on every rank of `group` each step (it is collective)."""

    def __init__(self, group: Any = None):
        self.group = group
        self.names: list[str] = []  # the agreed op order
        self.meta: dict[str, dict[str, str]] = {}

    def aggregate(self, timings: StepTimings,
                  system: dict[str, float] | None = None) -> dict[str, Any]:
        """The `ops` event body, identical on every rank:

        {step, step_ms, void_share, data_wait_share,
         ops: {name: {kind, count, mean_ms, total_ms, min_ms, median_ms, max_ms, max_call_ms,
                      slowest_rank, per_rank_ms, [tflops], [bytes, group, algo, busbw_gbps]}},
         ranks: [{rank, step_ms, compute_ms, comm_ms, data_ms, void_share, cpu_wait_ms}],
         [system: {field: [value of each rank]}]}
        total_ms is the mean over ranks of each rank's time in the op this step; min/median/
        max_ms and slowest_rank are across ranks. `system` is this rank's SystemSampler
        sample (the same fields on every rank); a field no rank measured (NaN) is left out,
        one some rank did not measure reads None there.
        """
        system = system or {}
        rows = self._gather(timings, system)
        if rows[:, 0].max() > 0:  # some rank has an op the agreed list lacks
            self._agree_names(timings)
            rows = self._gather(timings, system)
        return self._summarise(timings.step, rows, list(system))

    def _row(self, timings: StepTimings, system: dict[str, float]) -> torch.Tensor:
        new = any(name not in self.meta for name in timings.ops)
        row = [float(new), timings.step_ms, timings.compute_ms, timings.comm_ms,
               timings.data_ms, timings.void_share, timings.cpu_wait_ms, *system.values()]
        for name in self.names:
            s = timings.ops.get(name)
            row += ([s.count, s.total_ms, s.max_ms, s.flops or s.nbytes, s.bus_bytes]
                    if s else [0.0] * len(_OP_FIELDS))
        return torch.tensor(row, dtype=torch.float64)

    def _gather(self, timings: StepTimings, system: dict[str, float]) -> torch.Tensor:
        row = self._row(timings, system)
        if not dist.is_initialized():
            return row[None]
        rows = [torch.empty_like(row) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(rows, row, group=self.group)
        return torch.stack(rows)

    def _agree_names(self, timings: StepTimings) -> None:
        mine = {name: _meta(s) for name, s in timings.ops.items()}
        if dist.is_initialized():
            everyone: list[Any] = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(everyone, mine, group=self.group)
        else:
            everyone = [mine]
        for metas in everyone:
            for name, meta in metas.items():
                self.meta.setdefault(name, meta)
        self.names = sorted(self.meta)

    def _summarise(self, step: int, rows: torch.Tensor, system: list[str]) -> dict[str, Any]:
        ranks = self._group_ranks(rows.shape[0])
        table = rows.tolist()  # plain floats: per-element tensor indexing costs microseconds
        k, f = len(_RANK_FIELDS), len(_OP_FIELDS)
        measured = {name: [None if math.isnan(row[k + i]) else row[k + i] for row in table]
                    for i, name in enumerate(system)}
        first_op = k + len(system)
        ops: dict[str, Any] = {}
        for j, name in enumerate(self.names):
            block = [row[first_op + j * f: first_op + (j + 1) * f] for row in table]
            ran = [i for i, b in enumerate(block) if b[0] > 0]
            if not ran:
                continue
            totals = [block[i][1] for i in ran]
            median = statistics.median(totals)
            count = int(max(b[0] for b in block))
            meta = self.meta[name]
            entry: dict[str, Any] = {
                "kind": meta["kind"], "count": count,
                "total_ms": to_us(sum(totals) / len(totals)), "mean_ms": to_us(median / count),
                "min_ms": to_us(min(totals)), "median_ms": to_us(median),
                "max_ms": to_us(max(totals)), "max_call_ms": to_us(max(b[2] for b in block)),
                "slowest_rank": ranks[ran[totals.index(max(totals))]],
                "per_rank_ms": [to_us(b[1]) for b in block],
            }
            work = max(b[3] for b in block)
            if meta["kind"] == "matmul":
                entry["tflops"] = OpStats(name, "matmul", count, median, 0, 0,
                                          flops=int(work)).tflops
            elif meta["kind"] == "collective":
                bus_bytes = max(b[4] for b in block)
                entry.update(bytes=int(work), group=meta["group"], algo=meta["algo"],
                             collective=meta["collective"],
                             busbw_gbps=OpStats(name, "collective", count, median, 0, 0,
                                                bus_bytes=bus_bytes).busbw_gbps)
            ops[name] = entry
        per_rank = [{"rank": r, "step_ms": to_us(row[1]), "compute_ms": to_us(row[2]),
                     "comm_ms": to_us(row[3]), "data_ms": to_us(row[4]),
                     "void_share": to_ppm(row[5]), "cpu_wait_ms": to_us(row[6])}
                    for r, row in zip(ranks, table, strict=True)]
        summary = {
            "step": step,
            "step_ms": to_us(max(row[1] for row in table)),
            "void_share": to_ppm(statistics.fmean(row[5] for row in table)),
            "data_wait_share": to_ppm(statistics.fmean(
                row[4] / row[1] if row[1] > 0 else 0.0 for row in table)),
            "ops": ops,
            "ranks": per_rank,
        }
        if system:
            summary["system"] = {name: values for name, values in measured.items()
                                 if any(v is not None for v in values)}
        return summary

    def _group_ranks(self, n: int) -> list[int]:
        if not dist.is_initialized():
            return [0]
        if self.group is None:
            return list(range(n))
        return [dist.get_global_rank(self.group, i) for i in range(n)]


def _meta(s: OpStats) -> dict[str, str]:
    return {"kind": s.kind, "group": s.group, "algo": s.algo, "collective": s.collective}
