"""Detectors with the spec's default rules (timing-and-faults.md §6), one object per rank.

    detectors = Detectors(spec.faults.policy, rank)
    found = detectors.check_step(step, loss=local_loss, grad_norm=g, tokens_per_s=tps,
                                 memory_bytes=rss)              # every rank, every step
    found += detectors.check_ops(step, aggregate)               # OpAggregator result
    found += detectors.check_experts(step, experts)             # MoE `experts` stats

Thresholds come from `faults.policy.thresholds[kind][param]` over the policy's
DEFAULTS (policy.py, where each rule's defaults are explained). Every detector
state is plain numbers and lists, so `state_dict()` goes into the checkpoint as is.

Where the defaults differ from the spec's, it is for short runs on small models: the EwmaZ
warm-up is 5 steps for the loss and 20 for the grad norm (whose first steps swing more), not
120, so a spike early in a run is still caught; to keep a noisy but healthy curve quiet, a
flag also needs the value to be `min_rise` above the mean (twice the mean for the loss, 6x
for the grad norm). On a falling loss the EWMA mean lags above the curve, so noise rarely
gets there.
"""

from __future__ import annotations

import copy
import math
import statistics
from typing import Any

from engine.anomaly.anomaly import Anomaly
from engine.anomaly.policy import FaultPolicy, policy_thresholds
from engine.contract import AnomalyKind


class EwmaZ:
    """EWMA mean and variance; `update(x)` flags x when it is `z` sigmas and `min_rise` above
    the mean after `warmup` values, or above `max_factor` x the largest value seen once
    `max_after` values are in. Flagged values are not folded in (spec §2)."""

    def __init__(self, alpha: float, warmup: float, z: float, min_rise: float,
                 max_factor: float, max_after: float, wide: float):
        self.retune(alpha, warmup, z, min_rise, max_factor, max_after, wide)
        self.n = 0
        self.mean = 0.0
        self.var = 0.0
        self.max = -math.inf
        self.run = 0  # flagged values in a row

    def retune(self, alpha: float, warmup: float, z: float, min_rise: float,
               max_factor: float, max_after: float, wide: float) -> None:
        """New thresholds; the statistics gathered so far stay."""
        self.alpha, self.warmup, self.z, self.min_rise = alpha, warmup, z, min_rise
        self.max_factor, self.max_after, self.wide = max_factor, max_after, wide

    def update(self, x: float) -> dict[str, Any] | None:
        std = math.sqrt(self.var)
        z = (x - self.mean) / std if std > 0 else 0.0
        by_z = (self.n >= self.warmup and z > self.z
                and x > self.mean + self.min_rise * abs(self.mean))
        by_max = self.n >= self.max_after and x > self.max_factor * self.max
        if by_z or by_max:
            self.run += 1
            return {"value": x, "ewma_mean": self.mean, "ewma_std": std, "z": z,
                    "z_threshold": self.z, "min_rise": self.min_rise, "max_seen": self.max,
                    "max_factor": self.max_factor, "rule": "max_factor" if by_max else "ewma_z",
                    "flagged_in_a_row": self.run, "wide": self.run >= self.wide}
        self.run = 0
        self.n += 1
        if self.n == 1:
            self.mean = x
        else:
            # during warm-up a plain running mean/variance, then exponential forgetting
            a = max(self.alpha, 1.0 / self.n)
            delta = x - self.mean
            self.mean += a * delta
            self.var = (1 - a) * (self.var + a * delta * delta)
        self.max = max(self.max, x)
        return None

    def state_dict(self) -> dict[str, float]:
        return {"n": self.n, "mean": self.mean, "var": self.var, "max": self.max, "run": self.run}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.n, self.mean, self.var = int(state["n"]), state["mean"], state["var"]
        self.max, self.run = state["max"], int(state["run"])


class Detectors:
    """All per-rank detectors of one job. Each `check_*` returns the anomalies found now."""

    def __init__(self, policy: FaultPolicy | None = None, rank: int = 0):
        self.rank = rank
        self.thresholds = policy_thresholds(policy or FaultPolicy())
        self.loss = EwmaZ(**_ewma(self.thresholds["loss_spike"]))
        self.grad = EwmaZ(**_ewma(self.thresholds["grad_spike"]))
        self.throughput: list[float] = []
        self.best_throughput = 0.0
        self.throughput_low = False
        self.compute: list[list[float]] = []  # per step, per rank compute_ms
        self.straggler_run: dict[int, int] = {}
        self.straggling: list[int] = []
        self.named_at: dict[int, int] = {}  # straggling rank -> the step it was last named
        self.memory: list[float] = []
        self.memory_windows: list[float] = []
        self.memory_fired = False
        self.idle_steps: dict[str, list[int]] = {}  # layer -> per-expert idle streak
        self.entropy: dict[str, list[float]] = {}
        self.collapsed: list[str] = []

    def set_thresholds(self, policy: FaultPolicy) -> None:
        """The policy's thresholds from the next check on (the other detectors read
        `thresholds` at each check); what was seen so far stays."""
        self.thresholds = policy_thresholds(policy)
        self.loss.retune(**_ewma(self.thresholds["loss_spike"]))
        self.grad.retune(**_ewma(self.thresholds["grad_spike"]))

    # -- scalars every rank sees each step -------------------------------------------------
    def check_step(self, step: int, loss: float | None = None, grad_norm: float | None = None,
                   tokens_per_s: float | None = None,
                   memory_bytes: float | None = None) -> list[Anomaly]:
        """`loss` and `memory_bytes` are this rank's own (its micro-batch loss before the
        all-reduce, its RSS), so what they show is pinned on this rank; `grad_norm` and
        `tokens_per_s` are global, so their anomalies carry rank None. A NaN/Inf loss or grad
        norm is `nan` and skips the spike detectors (a NaN must not poison their statistics).
        """
        found: list[Anomaly] = []
        bad = {name: value for name, value in (("loss", loss), ("grad_norm", grad_norm))
               if value is not None and not math.isfinite(value)}
        if bad:
            rank = self.rank if "loss" in bad else None
            evidence = {**{k: str(v) for k, v in bad.items()}, "threshold": "finite"}
            found.append(Anomaly(AnomalyKind.NAN, "critical", step, rank, evidence))
        else:
            for kind, ewma, value, rank in ((AnomalyKind.LOSS_SPIKE, self.loss, loss, self.rank),
                                            (AnomalyKind.GRAD_SPIKE, self.grad, grad_norm, None)):
                if value is None:
                    continue
                evidence = ewma.update(value)
                if evidence is not None:
                    severe = evidence["wide"] or evidence["rule"] == "max_factor"
                    found.append(Anomaly(kind, "error" if severe else "warning", step, rank,
                                         evidence))
        if tokens_per_s is not None:
            found += self._check_throughput(step, tokens_per_s)
        if memory_bytes is not None:
            found += self._check_memory(step, memory_bytes)
        return found

    def _check_throughput(self, step: int, tokens_per_s: float) -> list[Anomaly]:
        t = self.thresholds["throughput_drop"]
        window = int(t["window"])
        self.throughput = (self.throughput + [tokens_per_s])[-window:]
        if step <= t["warmup"] or len(self.throughput) < window:
            return []
        current = statistics.median(self.throughput)
        self.best_throughput = max(self.best_throughput, current)
        ratio = current / self.best_throughput
        low = ratio < t["ratio"]
        fired = low and not self.throughput_low  # once per episode
        self.throughput_low = low
        if not fired:
            return []
        return [Anomaly(AnomalyKind.THROUGHPUT_DROP, "warning", step, None, {
            "tokens_per_s": current, "best_tokens_per_s": self.best_throughput,
            "ratio": ratio, "threshold": t["ratio"], "window": window})]

    def _check_memory(self, step: int, memory_bytes: float) -> list[Anomaly]:
        t = self.thresholds["memory_growth"]
        self.memory.append(memory_bytes)
        if len(self.memory) < t["window"]:
            return []
        self.memory_windows = (self.memory_windows + [statistics.fmean(self.memory)])[
            -int(t["windows"]) - 1:]
        self.memory = []
        w = self.memory_windows
        growing = len(w) > t["windows"] and all(
            b > a * (1 + t["min_growth"]) for a, b in zip(w, w[1:], strict=False))
        fired = growing and not self.memory_fired
        self.memory_fired = growing
        if not fired:
            return []
        return [Anomaly(AnomalyKind.MEMORY_GROWTH, "warning", step, self.rank, {
            "window_means_bytes": list(w), "min_growth": t["min_growth"],
            "windows": t["windows"], "window": t["window"]})]

    # -- cross-rank timings (an OpAggregator result, identical on all ranks) ---------------
    def check_ops(self, step: int, aggregate: dict[str, Any]) -> list[Anomaly]:
        """Straggler: a rank whose compute time is far above the other ranks' (their median)
        while they wait for it in collectives; named again while it stays one for `persist`
        steps. The time a rank's training thread waited for a core (`cpu_wait_ms`) more than
        the others did is not its compute: on cores shared with other processes one rank is
        starved for a few steps now and then, which is the host's contention, not a slow rank
        (a rank slowed by its own work, a sleep or a slower device waits on no run queue)."""
        t = self.thresholds["straggler"]
        rows = aggregate["ranks"]
        if len(rows) < 2:
            return []
        if self.compute and len(self.compute[0]) != len(rows):  # resharded: start over
            self.compute, self.straggler_run, self.straggling, self.named_at = [], {}, [], {}
        if step <= t["warmup"]:
            return []
        self.compute = (self.compute + [_compute_ms(aggregate)])[-int(t["window"]):]
        if len(self.compute) < t["window"]:
            return []
        per_rank = [statistics.median(col) for col in zip(*self.compute, strict=True)]
        found = []
        for i, row in enumerate(rows):
            rank = row["rank"]
            typical = statistics.median(per_rank[:i] + per_rank[i + 1:])
            score = typical / per_rank[i] if per_rank[i] > 0 else 1.0
            run = self.straggler_run.get(rank, 0) + 1 if score < t["score"] else 0
            self.straggler_run[rank] = run
            persisting = (rank in self.straggling
                          and step - self.named_at.get(rank, step) >= t["persist"])
            if run >= t["patience"] and (rank not in self.straggling or persisting):
                if not persisting:
                    self.straggling.append(rank)
                self.named_at[rank] = step
                found.append(Anomaly(AnomalyKind.STRAGGLER, "error", step, rank, {
                    "persisting": persisting,
                    "score": score, "threshold": t["score"], "compute_ms": per_rank[i],
                    "median_compute_ms": typical,
                    "comm_ms": {r["rank"]: r["comm_ms"] for r in rows},
                    "compute_ms_per_rank": dict(zip([r["rank"] for r in rows], per_rank,
                                                    strict=True)),
                    "window": t["window"], "patience": t["patience"]}))
            elif run == 0 and rank in self.straggling:
                self.straggling.remove(rank)
                self.named_at.pop(rank, None)
        return found

    # -- MoE routing --------------------------------------------------------------------------
    def check_experts(self, step: int, experts: dict[str, Any]) -> list[Anomaly]:
        """`experts`: {layer: {"tokens_per_expert": [c_i, ...], ...}} for the step."""
        t = self.thresholds["expert_collapse"]
        window = int(t["window"])
        found = []
        for layer, stats in experts.items():
            counts = [float(c) for c in stats["tokens_per_expert"]]
            total, n = sum(counts), len(counts)
            if n < 2 or total <= 0:
                continue
            entropy = -sum(c / total * math.log(c / total) for c in counts if c > 0) / math.log(n)
            key = str(layer)
            idle = self.idle_steps.setdefault(key, [0] * n)
            for i, c in enumerate(counts):
                idle[i] = idle[i] + 1 if c == 0 else 0
            history = self.entropy[key] = (self.entropy.get(key, []) + [entropy])[-window:]
            if len(history) < window or step <= t["warmup"]:
                continue
            mean_entropy = statistics.fmean(history)
            dead = sum(1 for s in idle if s >= window)
            collapsed = mean_entropy < t["entropy"] or dead >= t["dead_share"] * n
            if collapsed and key not in self.collapsed:
                self.collapsed.append(key)
                found.append(Anomaly(AnomalyKind.EXPERT_COLLAPSE, "error", step, None, {
                    "layer": key, "load_entropy": mean_entropy, "entropy_threshold": t["entropy"],
                    "dead_experts": dead, "dead_share_threshold": t["dead_share"],
                    "max_violation": max(counts) / (total / n) - 1, "window": window}))
            elif not collapsed and key in self.collapsed:
                self.collapsed.remove(key)
        return found

    # -- checkpointing ------------------------------------------------------------------------
    _PLAIN = ("throughput", "best_throughput", "throughput_low", "compute", "straggling",
              "memory", "memory_windows", "memory_fired", "idle_steps", "entropy", "collapsed")

    def state_dict(self) -> dict[str, Any]:
        return {"loss": self.loss.state_dict(), "grad": self.grad.state_dict(),
                "straggler_run": {str(k): v for k, v in self.straggler_run.items()},
                "named_at": {str(k): v for k, v in self.named_at.items()},
                **copy.deepcopy({name: getattr(self, name) for name in self._PLAIN})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss.load_state_dict(state["loss"])
        self.grad.load_state_dict(state["grad"])
        self.straggler_run = {int(k): v for k, v in state["straggler_run"].items()}
        # none in a checkpoint from before persistent stragglers were named again
        self.named_at = {int(k): v for k, v in state.get("named_at", {}).items()}
        for name in self._PLAIN:
            setattr(self, name, copy.deepcopy(state[name]))


def _compute_ms(aggregate: dict[str, Any]) -> list[float]:
    """Each rank's compute time less the time it waited for a core beyond what the other
    ranks waited (their median) in the same step: contention all ranks share stays in, so
    the ranks are still compared on their whole step, but one rank starved by the host is
    not thereby slow."""
    rows = aggregate["ranks"]
    waits = [r.get("cpu_wait_ms", 0.0) for r in rows]
    return [max(0.0, r["compute_ms"] - max(0.0, waits[i] - statistics.median(
        waits[:i] + waits[i + 1:]))) for i, r in enumerate(rows)]


def _ewma(params: dict[str, float]) -> dict[str, float]:
    return {k: params[k] for k in ("alpha", "warmup", "z", "min_rise", "max_factor",
                                   "max_after", "wide")}
