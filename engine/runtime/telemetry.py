"""What the loop measures and publishes: the step's reduction across ranks, the `step`, `ops`
and `experts` events, the progress bar, per-op timing of the model's modules, sampled
timeline traces and the Prometheus endpoint.

Every rank calls the reductions and `publish` at the same step (they are collective); rank 0's
`emit` publishes, the other ranks' drops.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.contract import Event, ExpertsEvent, LogEvent, OpsEvent, StepEvent
from engine.paro import ShardedDataParallel
from engine.runtime.flops import MATMUL_MODULES, TIMED_MODULES, forward_flops, matrix_weights
from engine.xputimer import (
    MetricsServer,
    OpAggregator,
    OpTimer,
    StepTimings,
    time_modules,
    write_trace,
)
from engine.xputimer.system import SystemSampler


@dataclass
class StepMetrics:
    step: int
    loss: float
    grad_norm: float
    lr: float
    tokens_per_s: float
    step_time: float
    tokens: int
    rss_bytes: int
    eval_loss: float | None = None
    # per source of the mixture, by name: tokens trained on so far, this step's loss, and at
    # an evaluation the held-out loss
    source_tokens: dict[str, int] | None = None
    source_loss: dict[str, float] | None = None
    eval_source_loss: dict[str, float] | None = None


@dataclass
class Worst:
    """The step's worst rank (one MAX all-reduce), and this rank's own sample."""

    step_time: float
    rss_bytes: int
    state_bytes: dict[str, int]
    comm: dict[str, int]
    local: dict[str, float]  # this rank's SystemSampler sample


class ProgressBar:
    """One line on stderr: step, loss, tokens/s; redrawn in place on a terminal."""

    def __init__(self, total: int):
        self.total = total
        self.tty = sys.stderr.isatty()
        self.every = 1 if self.tty else max(1, total // 20)

    def update(self, m: StepMetrics) -> None:
        if not self.tty and m.step % self.every and m.step != self.total:
            return
        width = 24
        filled = int(width * m.step / self.total)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] step {m.step}/{self.total} "
            f"loss {m.loss:.4f} tok/s {m.tokens_per_s:,.0f} lr {m.lr:.2e}"
        )
        if m.eval_loss is not None:
            line += f" eval {m.eval_loss:.4f}"
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        if self.tty and m.step == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


class Telemetry:
    def __init__(self, model: nn.Module, dp: ShardedDataParallel, timer: OpTimer, *,
                 top_k: int, world_size: int, device: torch.device, run_dir: Path,
                 emit: Callable[[Event], None], bar: ProgressBar | None = None,
                 metrics: MetricsServer | None = None):
        self.model, self.dp, self.timer = model, dp, timer
        self.top_k, self.world_size, self.device = top_k, world_size, device
        self.run_dir, self.emit = run_dir, emit
        self.bar, self.metrics = bar, metrics
        self.aggregator = OpAggregator()
        self.system = SystemSampler(device)
        self.last_timings: StepTimings | None = None
        self._module_timing: list = []
        self.set_timing(True)
        if metrics is not None:  # Prometheus text, for a Grafana
            emit(LogEvent(step=0, level="info", message=f"metrics at {metrics.start().url}"))

    def set_timing(self, enabled: bool) -> None:
        """Per-op timing on or off, the model's module hooks included (on by default; off
        only to measure what timing costs, bench/timing_overhead.py)."""
        for handle in self._module_timing:
            handle.remove()
        self._module_timing = []
        self.timer.enabled = enabled
        if enabled:
            weights = {m: matrix_weights(m) for m in self.model.modules()
                       if isinstance(m, MATMUL_MODULES)}  # counted once, not on every call
            self._module_timing = time_modules(
                self.model, self.timer, TIMED_MODULES,
                lambda m, args: forward_flops(m, args, self.top_k, weights[m]))

    def all_reduce_span(self, name: str, nbytes: int):
        """The timer's span for one of the loop's own all-reduces over every rank."""
        return self.timer.op(name, kind="collective", nbytes=nbytes, group="global",
                             algo="native", collective="all_reduce", group_size=self.world_size)

    def reduce_step(self, loss: torch.Tensor, commands: int,
                    counts: torch.Tensor) -> tuple[float, int, torch.Tensor]:
        """One all-reduce carries the loss, the number of commands rank 0 has read (the others
        add 0) and the routing counts of every MoE layer: the mean loss, the commands every
        rank takes and the global counts."""
        counts = counts.to(self.device)
        packed = torch.cat([
            loss.reshape(1), torch.tensor([float(commands)], device=self.device),
            counts.reshape(-1),
        ]).float()
        with self.all_reduce_span("metrics_all_reduce", packed.numel() * packed.element_size()):
            dist.all_reduce(packed)
        return float(packed[0]) / self.world_size, int(packed[1]), packed[2:].view_as(counts)

    def reduce_worst(self, started: float) -> Worst:
        """The worst rank's step time, memory, state bytes and traffic, in one MAX: a
        synchronous step is as slow as its slowest rank, and every rank's throughput detector
        must see the same number to agree on a drop."""
        local = self.system.sample()
        state, comm = self.dp.state_bytes(), self.dp.comm_stats()
        worst = torch.tensor([time.perf_counter() - started, int(local["rss_bytes"]),
                              *state.values(), *comm.values()], dtype=torch.float64)
        with self.all_reduce_span("worst_all_reduce", worst.numel() * worst.element_size()):
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        step_time, *rest = worst.tolist()
        rss, *rest = (int(v) for v in rest)
        return Worst(step_time, rss, dict(zip(state, rest[: len(state)], strict=True)),
                     dict(zip(comm, rest[len(state):], strict=True)), local)

    def end_step(self, step: int, trace_next: bool = False) -> StepTimings:
        """Close the step's timings; a sampled step's full timeline goes to a Chrome trace
        (collective: every rank sampled the same step). `trace_next` samples the next step
        (the evidence of an anomaly)."""
        timings = self.timer.step_end(step)
        if timings.sampled:
            trace = write_trace(self.timer, self.run_dir / "traces" / f"step-{step:06d}.json",
                                steps={step})
            if trace is not None:
                self.emit(LogEvent(step=step, level="info", message=f"timeline trace: {trace}",
                                   details={"trace": str(trace)}))
        if trace_next:
            self.timer.request_timeline()
        self.last_timings = timings
        return timings

    def publish(self, m: StepMetrics, worst: Worst, counts: torch.Tensor,
                trace_next: bool) -> tuple[dict[str, Any], list[dict]]:
        """Close the step's timings, aggregate them across ranks (every rank's system sample
        rides that all_gather) and publish the step; returns the ops and experts summaries."""
        ops = self.aggregator.aggregate(self.end_step(m.step, trace_next), worst.local)
        per_rank_system = ops.pop("system")
        if self.metrics is not None:
            self.metrics.update(ops)
        experts = self.model.expert_stats(counts)
        self.emit(StepEvent(
            step=m.step, loss=m.loss, grad_norm=m.grad_norm, lr=m.lr,
            tokens_per_s=m.tokens_per_s, step_time=m.step_time, tokens=m.tokens,
            memory={"rss_bytes": m.rss_bytes}, eval_loss=m.eval_loss,
            source_tokens=m.source_tokens, source_loss=m.source_loss,
            eval_source_loss=m.eval_source_loss,
            state_bytes=worst.state_bytes, comm=worst.comm, system=per_rank_system,
        ))
        self.emit(ExpertsEvent(step=m.step, layers=experts))
        self.emit(OpsEvent(step=m.step, step_ms=ops["step_ms"], void_share=ops["void_share"],
                           data_wait_share=ops["data_wait_share"], ops=ops["ops"],
                           ranks=ops["ranks"]))
        return ops, experts

    def show(self, m: StepMetrics) -> None:
        if self.bar is not None:
            self.bar.update(m)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
