"""Hang watchdog: a daemon thread per rank that knows the op in flight (spec §5).

It fires when an op in flight is older than `timeout_s` - the innermost host op (an outer op
whose inner ops keep finishing is making progress) or any async op - or, with no op in
flight, when for `timeout_s` no step has ended and no timed op has returned (a rank stuck
between timed ops). On firing it dumps every thread's Python stack of this process with
faulthandler into `dump_dir`, then calls `on_hang` with a `hang` Anomaly naming the rank and
the op (with its group and sequence number for a collective). It fires once per stuck op and
re-arms when the rank makes progress. It runs outside the blocked thread, so a blocked
training thread cannot silence it; `pause()` suspends it while a job is paused on purpose.
"""

from __future__ import annotations

import faulthandler
import threading
import time
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns

from engine.anomaly.anomaly import Anomaly
from engine.contract import AnomalyKind
from engine.xputimer.timer import OpTimer

DEFAULT_TIMEOUT_S = 300.0


class HangWatchdog:
    def __init__(self, timer: OpTimer, timeout_s: float, dump_dir: Path,
                 on_hang: Callable[[Anomaly], None], poll_s: float | None = None):
        if timeout_s <= 0:
            raise ValueError(f"hang_timeout_s: must be positive, got {timeout_s}")
        self.timer = timer
        self.timeout_ns = int(timeout_s * 1e9)
        self.dump_dir = Path(dump_dir)
        self.on_hang = on_hang
        self.poll_s = poll_s if poll_s is not None else min(1.0, timeout_s / 10)
        self._stop = threading.Event()
        self._paused = False
        self._fired_for: object = None
        self._thread = threading.Thread(target=self._run, name=f"hang-watchdog-{timer.rank}",
                                        daemon=True)

    def start(self) -> HangWatchdog:
        """Watch from now on: time spent before (building the model, resuming from a
        checkpoint) does not count toward the first step's timeout."""
        self._restart_clock()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._restart_clock()
        self._paused = False

    def _restart_clock(self) -> None:
        """An op-free stretch is timed from now (unwatched time is not a hang)."""
        self.timer.step_started_ns = max(self.timer.step_started_ns, perf_counter_ns())

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if not self._paused:
                self.check()

    def check(self) -> Anomaly | None:
        """One look; returns the anomaly if it fired now."""
        now = perf_counter_ns()
        in_flight = self.timer.in_flight()
        # a host op is stuck only if nothing inside it moves: look at the innermost one; an
        # async op (or one queued on a device) is stuck on its own
        host = [s for s in in_flight if not s.deferred]
        stuck = [s for s in in_flight if s.deferred] + host[-1:]
        if stuck:
            span = min(stuck, key=lambda s: s.t0)
            age, key = now - span.t0, span
            evidence = {"op": span.info.name, "op_kind": span.info.kind, "seq": span.seq,
                        "ops_in_flight": [s.info.name for s in in_flight]}
            if span.info.kind == "collective":
                evidence.update(group=span.info.group, algo=span.info.algo)
        else:
            # timed from the last progress: a long op that just returned is not a hang
            since = max(self.timer.step_started_ns, self.timer.returned_ns)
            age, key = now - since, ("idle", since)
            evidence = {"op": None, "last_op": self.timer.last_op}
        if age <= self.timeout_ns or key == self._fired_for:
            return None
        self._fired_for = key
        step = self.timer.current_step
        anomaly = Anomaly(AnomalyKind.HANG, "critical", step, self.timer.rank, {
            **evidence, "age_s": age / 1e9, "timeout_s": self.timeout_ns / 1e9,
            "detected_at": time.time(),  # wall clock: the event is published after a restart
            "stack_dump": str(self.dump_stacks(step)),
        })
        self.on_hang(anomaly)
        return anomaly

    def dump_stacks(self, step: int) -> Path:
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        path = self.dump_dir / f"hang-rank{self.timer.rank}-step{step}.txt"
        with path.open("w") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
        return path
