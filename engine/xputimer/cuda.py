"""CUDA backend: pooled timing events recorded on the op's stream, read when someone looks.

The training thread only records events (`start`, `stop`); it never synchronises. `collect()`
`query()`s the oldest pending end events in order, turns finished pairs into wall-clock
intervals (one reference event per stream, synchronised once at first use, spec §2) and
queues them for the timer. It runs when the timer closes a step and when the hang watchdog
looks at the ops in flight, so a span stays "in flight" until its end event has completed on
the device and a look has seen it. When the pool is empty an op is not timed and the drop is
counted (spec §3).

Why no poller thread, as XPUTimer has (spec F1): its poller is C++; a Python one wakes
every 100 us to take the GIL from the training thread. On an H200 (bench/measured/
2026-11-27-h200/timing_overhead.json) that cost 1.9% of a ling-mini step's wall time and 3%
of its CPU time, where the timed calls themselves account for 0.1%.

Tested only where CUDA exists: the CPU test machines have no GPU.
"""

from __future__ import annotations

import collections
import threading
from time import perf_counter_ns
from typing import Any

import torch

POOL_SIZE = 1024  # event pairs, as Megatron's straggler detector


class CudaEventTimer:
    def __init__(self, open_spans: dict[int, Any], completed: collections.deque,
                 pool_size: int = POOL_SIZE):
        self._open = open_spans
        self._completed = completed
        self._pool = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(pool_size)]
        self._pending: collections.deque = collections.deque()
        self._refs: dict[int, tuple[torch.cuda.Event, int]] = {}  # stream -> (event, wall ns)
        self._collecting = threading.Lock()  # the training thread and the watchdog's both look
        self.dropped = 0

    def start(self, span: Any) -> None:
        span.t0 = perf_counter_ns()  # host launch time
        stream = torch.cuda.current_stream()
        span.stream = 2 + (stream.stream_id % 1000)  # trace tids 0, 1 are host and async
        if stream.stream_id not in self._refs:
            self._reference(stream)
        if not self._pool:
            self.collect()
        if not self._pool:
            self.dropped += 1
            span.events = None
            return
        span.events = self._pool.pop()
        span.events[0].record(stream)

    def stop(self, span: Any) -> None:
        if span.events is None:
            self._open.pop(id(span), None)
            return
        span.events[1].record(torch.cuda.current_stream())
        span.deferred = True  # in flight until the device reaches the end event
        self._pending.append((span, torch.cuda.current_stream().stream_id))

    def _reference(self, stream: torch.cuda.Stream) -> None:
        # the one synchronisation: the first op on a stream anchors its device clock
        ref = torch.cuda.Event(enable_timing=True)
        ref.record(stream)
        ref.synchronize()
        self._refs[stream.stream_id] = (ref, perf_counter_ns())

    def collect(self) -> None:
        """Queue for the timer every span whose end event the device has reached, in order."""
        with self._collecting:
            while self._pending and self._pending[0][0].events[1].query():
                span, stream_id = self._pending.popleft()
                begin, end = span.events
                ref, ref_ns = self._refs[stream_id]
                t0 = ref_ns + int(ref.elapsed_time(begin) * 1e6)
                t1 = t0 + int(begin.elapsed_time(end) * 1e6)
                self._pool.append(span.events)
                self._open.pop(id(span), None)
                self._completed.append((span, t0, t1, span.stream))
