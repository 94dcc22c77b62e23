"""Explicit, near-free timing of named ops on one rank (XPUTimer style, no global profiler).

    timer = OpTimer(rank)                                  # backend="cuda" on GPU
    with timer.op("attention", kind="matmul", flops=f):
        ...
    with timer.op("grad_sync", kind="collective", nbytes=n, group="intra", algo="ring",
                  collective="all_reduce", group_size=4) as span:
        work = dist.all_reduce(t, async_op=True)
        span.finish_when(work)                             # stamped in the future's callback
    timings = timer.step_end(step)                         # StepTimings of the finished step

Levels (spec §4): L1 per-op aggregates are always on. L2 also writes every op into the
timeline ring for every `sample_every`-th step and for a step after `request_timeline()`.

Threads: the training thread opens and closes ops and calls `step_end`. Completions that
happen elsewhere (an async collective's callback, CUDA events the watchdog's look found
finished) are queued and accounted by the training thread at `step_end`, so the per-op
accumulators have a single writer.
A step is the time between two `step_end` calls (the first starts at construction).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from engine.xputimer.ring import TimelineRing

KINDS = ("matmul", "compute", "collective", "data", "host")
GROUPS = ("intra", "inter", "global")
# bus bandwidth factor per collective, nbytes being the size of the full (reduced or gathered)
# tensor: NCCL-tests' convention, equal to spec §2's count-per-shard form
_BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
COLLECTIVES = tuple(_BUS_FACTORS)
STREAM_HOST, STREAM_ASYNC = 0, 1


def bus_factor(collective: str, group_size: int) -> float:
    """The factor that turns algorithm bytes into bus bytes (spec §2)."""
    if collective not in _BUS_FACTORS:
        raise ValueError(f"collective: unknown {collective!r}; valid: {', '.join(COLLECTIVES)}")
    if group_size < 1:
        raise ValueError(f"group_size: must be at least 1, got {group_size}")
    return _BUS_FACTORS[collective](group_size)


class OpInfo:
    """What is fixed for an op name (its first call decides) plus this step's accumulators."""

    __slots__ = ("name", "code", "kind", "group", "algo", "collective", "bus_factor",
                 "count", "total_ns", "min_ns", "max_ns", "work", "seq")

    def __init__(self, name: str, code: int, kind: str, group: str, algo: str,
                 collective: str, factor: float):
        self.name, self.code, self.kind = name, code, kind
        self.group, self.algo, self.collective, self.bus_factor = group, algo, collective, factor
        self.seq = 0  # calls ever made, so (name, seq) names the same op instance on every rank
        self.reset()

    def reset(self) -> None:
        self.count = self.total_ns = self.max_ns = self.work = 0
        self.min_ns = 1 << 62


class Span:
    """One timed op instance; a context manager around the call site."""

    __slots__ = ("timer", "info", "work", "seq", "t0", "stream", "deferred", "events")

    def __init__(self, timer: OpTimer, info: OpInfo, work: int):
        self.timer, self.info, self.work = timer, info, work
        info.seq += 1
        self.seq = info.seq
        self.deferred = False

    def __enter__(self) -> Span:
        timer = self.timer
        timer._depth += 1
        if timer._cuda is None:
            self.t0 = perf_counter_ns()
        else:
            timer._cuda.start(self)
        timer._open[id(self)] = self
        return self

    def __exit__(self, *exc: Any) -> None:
        timer = self.timer
        timer._depth -= 1
        timer.returned_ns = t1 = perf_counter_ns()
        if self.deferred:
            return
        if timer._cuda is None:
            del timer._open[id(self)]
            timer._account(self, self.t0, t1, STREAM_HOST if timer._depth == 0 else -1)
        else:
            timer._cuda.stop(self)

    def finish_when(self, work: Any) -> None:
        """Time an async op until `work` is done: a torch.distributed Work, or any future with
        `add_done_callback` (torch.futures.Future, concurrent.futures.Future)."""
        self.deferred = True
        future = work.get_future() if hasattr(work, "get_future") else work
        future.add_done_callback(self._done)

    def _done(self, _future: Any) -> None:
        # runs on the backend's thread: only queue it, the training thread accounts it
        t1 = perf_counter_ns()
        self.timer._open.pop(id(self), None)
        self.timer._completed.append((self, self.t0, t1, STREAM_ASYNC))


class _Untimed:
    """What `op()` returns while timing is switched off: a span that records nothing."""

    __slots__ = ()

    def __enter__(self) -> _Untimed:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def finish_when(self, work: Any) -> None:
        return None


UNTIMED = _Untimed()


@dataclass
class OpStats:
    """One op's timings within one step on one rank."""

    name: str
    kind: str
    count: int
    total_ms: float
    min_ms: float
    max_ms: float
    flops: int = 0  # matmuls
    nbytes: int = 0  # collectives: algorithm bytes (the full tensor per call, summed)
    bus_bytes: float = 0.0
    group: str = ""
    algo: str = ""
    collective: str = ""

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.count

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s = flop / latency_us / 1e6 (spec §2)."""
        return self.flops / (self.total_ms * 1e3) / 1e6 if self.total_ms > 0 else 0.0

    @property
    def algbw_gbps(self) -> float:
        return self.nbytes * 8 / 1e3 / (self.total_ms * 1e3) if self.total_ms > 0 else 0.0

    @property
    def busbw_gbps(self) -> float:
        """Bus bandwidth in Gbit/s = bus bytes * 8 / 1e3 / latency_us (spec §2)."""
        return self.bus_bytes * 8 / 1e3 / (self.total_ms * 1e3) if self.total_ms > 0 else 0.0


@dataclass
class StepTimings:
    """One rank's step: wall time, per-op stats, and the shares spec F8/F9 asks for."""

    rank: int
    step: int
    step_ms: float
    ops: dict[str, OpStats] = field(default_factory=dict)
    covered_ms: float = 0.0  # |union of top-level timed intervals|
    # of step_ms, the time the training thread was runnable but waited for a core: the
    # host's contention, not the rank's work (0 where the kernel does not tell)
    cpu_wait_ms: float = 0.0
    sampled: bool = False  # whether this step's ops went into the timeline ring

    @property
    def void_share(self) -> float:
        """1 - |union of timed intervals| / step time: time no timer accounts for."""
        return max(0.0, 1.0 - self.covered_ms / self.step_ms) if self.step_ms > 0 else 0.0

    def _kind_ms(self, kind: str) -> float:
        return sum(s.total_ms for s in self.ops.values() if s.kind == kind)

    @property
    def data_ms(self) -> float:
        return self._kind_ms("data")

    @property
    def comm_ms(self) -> float:
        """Time in collectives, peer wait included (the straggler signal)."""
        return self._kind_ms("collective")

    @property
    def compute_ms(self) -> float:
        """Step time that is neither collective nor data wait."""
        return max(0.0, self.step_ms - self.comm_ms - self.data_ms)

    @property
    def data_wait_share(self) -> float:
        return self.data_ms / self.step_ms if self.step_ms > 0 else 0.0


class OpTimer:
    """Per-rank op timer: `op()` around call sites, `step_end()` once per training step."""

    def __init__(self, rank: int = 0, backend: str = "cpu", sample_every: int = 0,
                 start_step: int = 1, ring_capacity: int = 1 << 16, enabled: bool = True):
        if backend not in ("cpu", "cuda"):
            raise ValueError(f"backend: must be 'cpu' or 'cuda', got {backend!r}")
        if sample_every < 0:
            raise ValueError(f"sample_every: must be at least 0 (0 = only on request), "
                             f"got {sample_every}")
        self.rank = rank
        self.backend = backend
        self.sample_every = sample_every
        # off: `op()` hands out a no-op span (for components run without timing, for measuring
        # what timing costs, and for users who want the last fraction of a percent back)
        self.enabled = enabled
        self.ring = TimelineRing(ring_capacity)
        self.names: list[str] = []  # op code -> name, for the timeline
        self._ops: dict[str, OpInfo] = {}
        self._open: dict[int, Span] = {}  # ops in flight, read by the watchdog
        self._completed: collections.deque = collections.deque()
        self._intervals: list[tuple[int, int]] = []
        self._depth = 0
        self._step = start_step
        self._sampling = bool(sample_every and start_step % sample_every == 0)
        self.last_op = ""
        self.step_started_ns = perf_counter_ns()
        self.step_started_wait_ns = _run_queue_wait_ns()
        self.returned_ns = 0  # when the training thread last came back from a timed op
        # perf_counter is per host; this offset turns it into wall-clock ns for the trace
        self.wall_offset_ns = time.time_ns() - perf_counter_ns()
        self._cuda = None
        if backend == "cuda":
            from engine.xputimer.cuda import CudaEventTimer

            self._cuda = CudaEventTimer(self._open, self._completed)

    # -- hot path ---------------------------------------------------------------------------
    def op(self, name: str, kind: str = "compute", *, flops: int = 0, nbytes: int = 0,
           group: str = "", algo: str = "", collective: str = "",
           group_size: int = 0) -> Span | _Untimed:
        """A context manager timing one call of op `name`.

        kind: one of KINDS. matmul: pass `flops` (2*B*M*N*K). collective: pass `nbytes` (the
        full tensor), `group` (intra/inter/global), `algo`, `collective` (one of COLLECTIVES)
        and `group_size` to get bus bandwidth. The first call of a name fixes its kind,
        group, algorithm and collective.
        """
        if not self.enabled:
            return UNTIMED
        info = self._ops.get(name)
        if info is None:
            info = self._register(name, kind, group, algo, collective, group_size)
        return Span(self, info, flops or nbytes)

    def _account(self, span: Span, t0: int, t1: int, stream: int) -> None:
        info = span.info
        dur = t1 - t0
        info.count += 1
        info.total_ns += dur
        info.work += span.work
        if dur > info.max_ns:
            info.max_ns = dur
        if dur < info.min_ns:
            info.min_ns = dur
        self.last_op = info.name
        if stream >= 0:  # nested host ops lie inside their parent's interval
            self._intervals.append((t0, t1))
        if self._sampling:
            self.ring.append(info.code, t0 + self.wall_offset_ns, dur, span.work, span.seq,
                             max(stream, STREAM_HOST), self._step, KINDS.index(info.kind))

    # -- step boundary ----------------------------------------------------------------------
    def step_end(self, step: int) -> StepTimings:
        """Close step `step`: account queued completions and return its timings."""
        now, waited = perf_counter_ns(), _run_queue_wait_ns()
        if self._cuda is not None:
            self._cuda.collect()
        completed = self._completed
        while completed:
            self._account(*completed.popleft())
        start = self.step_started_ns
        timings = StepTimings(self.rank, step, (now - start) / 1e6, sampled=self._sampling,
                              covered_ms=_union_ns(self._intervals, start, now) / 1e6,
                              cpu_wait_ms=(waited - self.step_started_wait_ns) / 1e6)
        for info in self._ops.values():
            if info.count:
                timings.ops[info.name] = OpStats(
                    info.name, info.kind, info.count, info.total_ns / 1e6, info.min_ns / 1e6,
                    info.max_ns / 1e6,
                    flops=info.work if info.kind == "matmul" else 0,
                    nbytes=info.work if info.kind == "collective" else 0,
                    bus_bytes=info.work * info.bus_factor, group=info.group, algo=info.algo,
                    collective=info.collective)
                info.reset()
        self._intervals.clear()
        self._step = step + 1
        self._sampling = bool(self.sample_every and self._step % self.sample_every == 0)
        self.step_started_ns = perf_counter_ns()
        self.step_started_wait_ns = _run_queue_wait_ns()
        return timings

    @property
    def current_step(self) -> int:
        """The step in progress: one past the last `step_end`."""
        return self._step

    def request_timeline(self) -> None:
        """Record the step in progress into the timeline (L2) from now on, whatever
        `sample_every` says; called right after `step_end` it records the whole next step."""
        self._sampling = True

    def in_flight(self) -> list[Span]:
        """Ops started and not finished, oldest first (for the hang watchdog)."""
        if self._cuda is not None:
            self._cuda.collect()
        spans = list(self._open.values())
        return sorted(spans, key=lambda s: getattr(s, "t0", 0))

    def _register(self, name: str, kind: str, group: str, algo: str, collective: str,
                  group_size: int) -> OpInfo:
        if kind not in KINDS:
            raise ValueError(f"kind: op {name!r} has unknown kind {kind!r}; "
                             f"valid: {', '.join(KINDS)}")
        factor = 0.0
        if kind == "collective":
            if group not in GROUPS:
                raise ValueError(f"group: collective {name!r} needs group in {GROUPS}, "
                                 f"got {group!r}")
            factor = bus_factor(collective, group_size) if collective else 1.0
        info = OpInfo(name, len(self.names), kind, group, algo, collective, factor)
        self._ops[name] = info
        self.names.append(name)
        return info


def _union_ns(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of intervals clipped to [lo, hi]."""
    covered, end = 0, lo
    for a, b in sorted(intervals):
        a, b = max(a, end), min(b, hi)
        if b > a:
            covered += b - a
            end = b
    return covered


_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def _run_queue_wait_ns() -> int:
    """Nanoseconds the calling thread has spent runnable on a run queue, waiting for a core
    (Linux's schedstat, second field); 0 where the kernel does not tell."""
    try:
        return int(_SCHEDSTAT.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
