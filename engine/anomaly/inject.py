"""Fault injection from the job spec's `faults.inject`, for tests and demos.

The loop calls the hooks at fixed places of every step; each does nothing unless an
injection targets this rank and step:

    injector.crash_point(step)                  # step start: os._exit(INJECTED_CRASH_EXIT_CODE)
    with timer.op("forward"), injector.slowdown(step):   # slow_rank: the op takes factor x
        loss = model(...)
        injector.hang_point(step)               # hang: block this thread forever
    loss = injector.corrupt_loss(step, loss)    # loss_spike: loss * factor; nan: NaN
    loss.backward()                             # (so the gradients spike or go NaN too)
    labels = injector.corrupt_batch(step, first_sample, labels)   # bad_batch (before forward)

loss_spike, nan, hang and crash are transient: they fire once per job. With `state_dir` (the
run folder) the firing is remembered in a marker file, so a rank restarted after an injected
crash, or a step replayed after a rollback, runs clean. A loss_spike is thus a spike of the
step, not of its data: trained again on the same batch, the step is healthy. bad_batch is the
data's: the micro-batch its step first trains on (named by its first global sample index,
kept in the marker file) has its labels scrambled every time it is trained on, so the spike
comes back with the batch. slow_rank lasts from its step on (to its `until` step if it has one).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

FaultKind = Literal["loss_spike", "nan", "slow_rank", "hang", "crash", "bad_batch"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
INJECTED_CRASH_EXIT_CODE = 86


@dataclass
class FaultInjection:
    """One entry of the spec's `faults.inject`."""

    kind: FaultKind
    step: int
    rank: int = 0
    factor: float = 10.0  # loss multiplier for loss_spike, slow-down for slow_rank
    until: int = 0  # slow_rank: its last slow step (0: it stays slow)


class FaultInjector:
    def __init__(self, injections: list[FaultInjection], rank: int,
                 state_dir: Path | None = None):
        self.rank = rank
        self.state_dir = Path(state_dir) if state_dir is not None else None
        # keep each injection's index in the spec: it names its marker file
        self._mine = [(i, inj) for i, inj in enumerate(injections) if inj.rank == rank]
        self._fired: set[int] = set()
        # the first global sample index of each micro-batch a bad_batch injection made bad
        self._bad = {int(m.read_text()) for m in self.state_dir.glob("injected-*-bad_batch")
                     if m.read_text()} if self.state_dir is not None else set()

    def _mine_index(self, injection: FaultInjection) -> int:
        return next(i for i, inj in self._mine if inj is injection)

    def _take(self, kind: str, step: int) -> FaultInjection | None:
        """The one-shot injection of `kind` due now, marked as fired."""
        for i, inj in self._mine:
            if inj.kind == kind and inj.step == step and not self._has_fired(i):
                self._fired.add(i)
                if self.state_dir is not None:
                    self.state_dir.mkdir(parents=True, exist_ok=True)
                    (self.state_dir / f"injected-{i}-{kind}").touch()
                return inj
        return None

    def _has_fired(self, i: int) -> bool:
        if i in self._fired:
            return True
        return self.state_dir is not None and any(self.state_dir.glob(f"injected-{i}-*"))

    def corrupt_batch(self, step: int, first_sample: int, labels: Any) -> Any:
        """The micro-batch's labels, scrambled if it is a bad batch: the one a bad_batch
        injection's step first trains on (`first_sample`: its first global sample index),
        whenever it comes again. Deterministic, so the same data spikes the same way."""
        if (inj := self._take("bad_batch", step)) is not None:
            self._bad.add(first_sample)
            if self.state_dir is not None:  # remembered across a restart
                (self.state_dir / f"injected-{self._mine_index(inj)}-bad_batch").write_text(
                    str(first_sample))
        if first_sample not in self._bad:
            return labels
        # every label moved half the byte range (ids below 256, valid in any vocabulary):
        # text the model has learned to predict becomes bytes it has learned never follow
        return (labels + 128) % 256

    def corrupt_loss(self, step: int, loss: Any) -> Any:
        """The loss, multiplied by the factor (loss_spike) or made NaN (nan) when due."""
        spike = self._take("loss_spike", step)
        if spike is not None:
            loss = loss * spike.factor
        if self._take("nan", step) is not None:
            loss = loss * float("nan")
        return loss

    @contextmanager
    def slowdown(self, step: int,
                 timed: Callable[[], AbstractContextManager] = nullcontext) -> Iterator[None]:
        """Around an op: from a slow_rank injection's step on (to its `until`), stretch the op
        to factor x; the added time in a `timed()` span of its own (a slower device's work)."""
        factor = max((inj.factor for _, inj in self._mine if inj.kind == "slow_rank"
                      and inj.step <= step and (not inj.until or step <= inj.until)),
                     default=1.0)
        start = time.perf_counter()
        yield
        if factor > 1.0:
            with timed():
                time.sleep((factor - 1.0) * (time.perf_counter() - start))

    def hang_point(self, step: int) -> None:
        """Block this thread for good when a hang is due (the watchdog thread keeps running)."""
        if self._take("hang", step) is not None:
            threading.Event().wait()

    def crash_point(self, step: int) -> None:
        """Kill this process at once, without cleanup, when a crash is due."""
        if self._take("crash", step) is not None:
            os._exit(INJECTED_CRASH_EXIT_CODE)
