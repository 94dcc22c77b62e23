"""CUDA backend: pooled timing events recorded on the op's stream, read by a poller thread.

The training thread only records events (`start`, `stop`); it never synchronises. A daemon
poller `query()`s the oldest pending end events in order, turns finished pairs into wall-clock
intervals (one reference event per stream, synchronised once at first use, spec §2) and
queues them for the timer, which accounts them at its next `step_end`. When the pool is
empty an op is not timed and the drop is counted (spec §3). A span stays "in flight" for the
watchdog until its end event has completed on the device.

Tested only where CUDA exists: the CPU test machines have no GPU.
"""

from __future__ import annotations

import collections
import threading
import time
from time import perf_counter_ns
from typing import Any

import torch

POOL_SIZE = 1024  # event pairs, as Megatron's straggler detector


class CudaEventTimer:
    def __init__(self, open_spans: dict[int, Any], completed: collections.deque,
                 pool_size: int = POOL_SIZE, idle_sleep_s: float = 100e-6):
        self._open = open_spans
        self._completed = completed
        self._pool = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(pool_size)]
        self._pending: collections.deque = collections.deque()
        self._refs: dict[int, tuple[torch.cuda.Event, int]] = {}  # stream -> (event, wall ns)
        self.dropped = 0
        self._idle_sleep_s = idle_sleep_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="xputimer-cuda", daemon=True)
        self._thread.start()

    def start(self, span: Any) -> None:
        span.t0 = perf_counter_ns()  # host launch time
        stream = torch.cuda.current_stream()
        span.stream = 2 + (stream.stream_id % 1000)  # trace tids 0, 1 are host and async
        if stream.stream_id not in self._refs:
            self._reference(stream)
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

    def _poll(self) -> None:
        while not self._stop.is_set():
            if not self._pending or not self._pending[0][0].events[1].query():
                time.sleep(self._idle_sleep_s)
                continue
            span, stream_id = self._pending.popleft()
            begin, end = span.events
            ref, ref_ns = self._refs[stream_id]
            t0 = ref_ns + int(ref.elapsed_time(begin) * 1e6)
            t1 = t0 + int(begin.elapsed_time(end) * 1e6)
            self._pool.append(span.events)
            self._open.pop(id(span), None)
            self._completed.append((span, t0, t1, span.stream))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
