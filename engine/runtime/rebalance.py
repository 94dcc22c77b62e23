"""AntDT's answer to a transient straggler: give the slow rank less of the batch.

`Rebalancer` sets each data-parallel rank's share of the step's global batch (samples, which
the loader spreads over the accumulation micro-steps) from the ranks' measured speed: samples
trained per millisecond of forward and backward, the median over a window of steps. Shares in
proportion to the speeds make the ranks' compute times meet, so the fast ranks stop waiting
for the slow one in the collectives. It engages when the fault policy answers a straggler with
`rebalance` (or a person sends `rebalance` with "auto"), follows the speeds while engaged and,
once the ranks' times agree, steps back toward even shares, so a straggler that recovers gets
its share back; it lets go when the shares are even again. A person may also pin shares (a
list) or ask for even ones; the loader keeps the shares and the checkpoints keep both.

The update stays the balanced run's on the same samples: the trainer weights each micro-batch
by its samples (ShardedDataParallel.forward_backward), the spec's correctness rule. Every rank
decides from the same all-gathered timings, so the shares agree without a collective.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.contract import ShareMode
from engine.runtime.commands import CommandRefused

PINNED = "pinned"  # the mode after a person set the shares


class Loader(Protocol):
    """What the rebalancer steers (engine.data.loader.TokenLoader)."""

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


# the ops whose time grows with a rank's samples: the model's forward and backward, and an
# injected slowdown (engine.anomaly.inject) standing in for a slower device; not the optimizer,
# the collectives or the loop's own work, which take as long whatever the shares
SAMPLE_OPS = ("forward", "backward", "slow_rank")


def sample_ms(ops: dict[str, Any], world_size: int) -> list[float] | None:
    """Each rank's time in SAMPLE_OPS this step, from the `ops` event's per-rank times."""
    timed = [ops[name]["per_rank_ms"] for name in SAMPLE_OPS if name in ops]
    if not timed or any(len(times) != world_size for times in timed):
        return None
    return [sum(times) for times in zip(*timed, strict=True)]


@dataclass(frozen=True)
class Change:
    """New shares and why: following the speeds, or a step back toward even."""

    shares: list[int]
    reason: str


class Rebalancer:
    def __init__(self, loader: Loader, thresholds: Callable[[], dict[str, float]]):
        """`thresholds()`: the fault policy's straggler thresholds now (a live `set` changes
        them)."""
        self.loader = loader
        self.thresholds = thresholds
        self.mode: str = ShareMode.EVEN
        # per step: each rank's samples per ms of sample compute, and its ms
        self.speeds: list[list[float]] = []
        self.times: list[list[float]] = []
        self.since_change = 0  # steps since the shares changed or the last decision
        self.probe_every = 1  # balanced windows before the next step toward even
        self.balanced = 0  # balanced windows since the last change
        self.probing = False  # the last change was a step toward even

    @property
    def window(self) -> int:
        return max(1, int(self.thresholds()["rebalance_window"]))

    def observe(self, ops: dict[str, Any], trained_with: list[int]) -> Change | None:
        """One step's op timings (the `ops` event's `ops`, the same on every rank) and the
        shares it trained with; the change of shares following them made, if any."""
        times = sample_ms(ops, len(trained_with))
        if times is None:
            return None
        window = self.window
        self.times = (self.times + [times])[-window:]
        self.speeds = (self.speeds + [[n / max(ms, 1e-3) for n, ms in
                                       zip(trained_with, times, strict=True)]])[-window:]
        self.since_change += 1
        if self.mode != ShareMode.AUTO or self.since_change < window:
            return None
        self.since_change = 0  # one decision a window
        return self._follow()

    def engage(self) -> list[int]:
        """Follow the speeds from now on (the policy's answer to a straggler); the shares from
        the next step on."""
        self.mode, self.probe_every, self.balanced, self.probing = ShareMode.AUTO, 1, 0, False
        if self.speeds:
            self._apply(self._by_speed(), ShareMode.AUTO)
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

    def _by_speed(self) -> list[int]:
        speeds = [statistics.median(column) for column in zip(*self.speeds, strict=True)]
        return proportional_shares(speeds, self.loader.global_batch, self.loader.grad_accum)

    def _follow(self) -> Change | None:
        """One window's decision. While a rank takes longer than the median rank by more than
        the tolerance, shares in proportion to the ranks' speeds: repeated window after window
        its fixed point is equal times (per-step costs that do not grow with the samples make
        each change an under-correction). Otherwise a step halfway back to even: at once when
        a rank with less than an even share is the faster (a straggler that recovered), else
        after `probe_every` windows of agreeing times (where the samples barely change the
        times, speeds cannot tell a recovered straggler from a slow one: the shares find out;
        a step that makes a rank slow again is undone by the next window, and the next step
        waits twice as long). Shares within the tolerance of even become even: it lets go."""
        loader, tolerance = self.loader, self.thresholds()["rebalance_tolerance"]
        even = loader.even_shares()
        times = [statistics.median(column) for column in zip(*self.times, strict=True)]
        typical = statistics.median(times)
        if any(t > (1 + tolerance) * typical for t in times):
            if self.probing:
                self.probe_every *= 2
            target, reason, self.probing, self.balanced = (
                self._by_speed(), "following the ranks' speeds", False, 0)
        else:
            recovered = any(t < (1 - tolerance) * typical and n < e
                            for t, n, e in zip(times, loader.shares, even, strict=True))
            self.balanced += 1
            if not recovered and self.balanced < self.probe_every:
                return None
            halfway = [(n + e) / 2 for n, e in zip(loader.shares, even, strict=True)]
            target = proportional_shares(halfway, loader.global_batch, loader.grad_accum)
            reason, self.probing, self.balanced = "halfway back to even shares", True, 0
        if all(abs(t - e) <= tolerance * e for t, e in zip(target, even, strict=True)):
            target, reason = even, "back to even shares"
        if target == loader.shares:
            return None
        self._apply(target, ShareMode.EVEN if target == even else ShareMode.AUTO)
        return Change(list(target), reason)

    def _apply(self, shares: list[int], mode: str) -> None:
        self.loader.set_shares(shares)
        self.mode = mode
        self.since_change = 0

    def state_dict(self) -> dict[str, Any]:
        return {"mode": str(self.mode), "probe_every": self.probe_every}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """After the loader's, which gives up shares that do not fit the run (a reshard)."""
        mode = state.get("mode", ShareMode.EVEN)  # none before rebalancing existed
        if mode == PINNED and self.loader.shares == self.loader.even_shares():
            mode = ShareMode.EVEN
        self.mode, self.probe_every = mode, int(state.get("probe_every", 1))
        self.speeds, self.times, self.since_change = [], [], 0
        self.balanced, self.probing = 0, False
