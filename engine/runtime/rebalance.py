"""AntDT's answer to a transient straggler: give the slow rank less of the batch.

`Rebalancer` sets each data-parallel rank's share of the step's global batch (samples, which
the loader spreads over the accumulation micro-steps) from the ranks' measured speed: samples
trained per millisecond of compute, the median over a window of steps. Shares in proportion
to the speeds make the ranks' compute times meet, so the fast ranks stop waiting for the slow
one in the collectives. It engages when the fault policy answers a straggler with `rebalance`
(or a person sends `rebalance` with "auto"), follows the speeds while engaged, so a straggler
that recovers gets its share back, and lets go once even shares are within the tolerance. A
person may also pin shares (a list) or ask for even ones; the loader keeps the shares and the
checkpoints keep both.

The update stays the balanced run's on the same samples: the trainer weights each micro-batch
by its samples (ShardedDataParallel.forward_backward), the spec's correctness rule. Every rank
decides from the same all-gathered timings, so the shares agree without a collective.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any, Protocol

from engine.contract import ShareMode
from engine.runtime.commands import CommandRefused

PINNED = "pinned"  # the mode after a person set the shares


class Loader(Protocol):
    """What the rebalancer steers (engine.runtime.data.TokenLoader)."""

    shares: list[int]
    global_batch: int
    grad_accum: int
    world_size: int

    def even_shares(self) -> list[int]: ...

    def share_errors(self, shares: object) -> str | None: ...

    def set_shares(self, shares: list[int]) -> None: ...


def proportional_shares(weights: list[float], total: int, least: int) -> list[int]:
    """`total` cut in proportion to `weights` into whole numbers of at least `least` each: a
    part that would fall below `least` gets `least` and the others share the rest (largest
    remainders; ties to the lower rank, so every rank computes the same cut)."""
    floor: dict[int, int] = {}
    while True:
        free = [i for i in range(len(weights)) if i not in floor]
        rest = total - least * len(floor)
        if not free:
            break
        raw = {i: rest * weights[i] / sum(weights[j] for j in free) for i in free}
        low = [i for i in free if raw[i] < least]
        if not low:
            break
        floor.update(dict.fromkeys(low, least))
    cut = {i: int(raw[i]) for i in free}
    for i in sorted(free, key=lambda i: (cut[i] - raw[i], i))[: rest - sum(cut.values())]:
        cut[i] += 1
    return [floor.get(i, cut.get(i, least)) for i in range(len(weights))]


class Rebalancer:
    def __init__(self, loader: Loader, thresholds: Callable[[], dict[str, float]]):
        """`thresholds()`: the fault policy's straggler thresholds now (a live `set` changes
        them)."""
        self.loader = loader
        self.thresholds = thresholds
        self.mode: str = ShareMode.EVEN
        self.speeds: list[list[float]] = []  # per step, per rank: samples per ms of compute
        self.since_change = 0

    @property
    def window(self) -> int:
        return max(1, int(self.thresholds()["rebalance_window"]))

    def observe(self, ranks: list[dict[str, Any]], trained_with: list[int]) -> list[int] | None:
        """One step's per-rank timings (the `ops` event's `ranks`, the same on every rank) and
        the shares the step trained with; returns the new shares when following the speeds
        changed them."""
        compute = [row["compute_ms"] for row in sorted(ranks, key=lambda row: row["rank"])]
        if len(compute) != len(trained_with):
            return None
        row = [n / max(ms, 1e-3) for n, ms in zip(trained_with, compute, strict=True)]
        self.speeds = (self.speeds + [row])[-self.window:]
        self.since_change += 1
        if self.mode != ShareMode.AUTO or self.since_change < self.window:
            return None
        return self._follow()

    def engage(self) -> list[int]:
        """Follow the speeds from now on (the policy's answer to a straggler); the shares from
        the next step on."""
        self.mode = ShareMode.AUTO
        if self.speeds:
            self._follow()
        return list(self.loader.shares)

    def steer(self, shares: Any) -> list[int]:
        """A person's `rebalance`: "auto", "even" or a list of samples per rank (pinned until
        the next rebalance); the shares from the next step on. CommandRefused naming why."""
        loader = self.loader
        if loader.world_size < 2:
            raise CommandRefused("rebalance: the job has one data-parallel rank; there is no "
                                 "other rank to share its batch with")
        if shares == ShareMode.AUTO:
            return self.engage()
        if shares == ShareMode.EVEN:
            self._apply(loader.even_shares(), ShareMode.EVEN)
        else:
            error = loader.share_errors(shares)
            if error is not None:
                raise CommandRefused(f"rebalance: args.shares {error} (or "
                                     f"{ShareMode.AUTO.value!r} or {ShareMode.EVEN.value!r})")
            self._apply(shares, PINNED)
        return list(loader.shares)

    def _follow(self) -> list[int] | None:
        loader = self.loader
        speeds = [statistics.median(column) for column in zip(*self.speeds, strict=True)]
        target = proportional_shares(speeds, loader.global_batch, loader.grad_accum)
        even = loader.even_shares()
        slack = self.thresholds()["rebalance_tolerance"] * even[0]
        if all(abs(t - e) <= slack for t, e in zip(target, even, strict=True)):
            target = even
            self.mode = ShareMode.EVEN  # the ranks are as fast as each other again: let go
        elif all(abs(t - s) <= max(1.0, slack) for t, s in zip(target, loader.shares,
                                                                  strict=True)):
            return None  # too small a change to be worth one
        if target == loader.shares:
            return None
        self._apply(target, self.mode)
        return list(target)

    def _apply(self, shares: list[int], mode: str) -> None:
        self.loader.set_shares(shares)
        self.mode = mode
        self.since_change = 0

    def state_dict(self) -> dict[str, Any]:
        return {"mode": str(self.mode)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """After the loader's, which gives up shares that do not fit the run (a reshard)."""
        mode = state.get("mode", ShareMode.EVEN)  # none before rebalancing existed
        if mode == PINNED and self.loader.shares == self.loader.even_shares():
            mode = ShareMode.EVEN
        self.mode = mode
        self.speeds, self.since_change = [], 0
