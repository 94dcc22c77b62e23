"""Overhead of per-op timing on a real training step: off, always-on (L1), sampled (L2).

    .venv/bin/python -m bench.timing_overhead [--preset tiny] [--rounds 30] [--block 1]

The workload is a stand-in for the training loop (engine/runtime/train.py does not wire the
timers yet): the real MoE model and data loader, AdamW, and a real gloo all-reduce of the
gradients in a one-rank group. Every module of interest (attention, router, routed and
shared experts, norms) is timed through forward hooks (`engine.xputimer.time_modules`), as
are data loading, backward, the gradient all-reduce, clipping and the optimizer step, and
each step ends with `step_end` plus the cross-rank aggregation, so "on" pays for everything
timing costs.

The three modes alternate step by step (blocks of `--block` steps) over `--rounds` rounds,
so drift and machine noise fall on all of them alike. `ratios` compare the median process
CPU time per step (one intra-op thread: on a quiet machine it is the step time; on a shared
one it is not inflated by other tenants' processes), `wall_ratios` the median wall-clock
step times. Both
carry noise of a few percent on a shared machine, so the JSON also gives an estimate
that noise hardly touches: what timing adds to one hooked module call (best of 5 tight loops)
times the ops per step, plus the measured median of `step_end` and the aggregation.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

from engine.moe.config import preset
from engine.moe.model import Attention, MoEModel, RMSNorm, RoutedExperts, SwiGLU
from engine.moe.router import Router
from engine.runtime.data import TokenLoader, load_tokens
from engine.runtime.spec import DatasetSpec
from engine.xputimer import OpAggregator, OpTimer, StepTimings, time_modules

MODES = ("off", "always_on", "sampled")
TIMED_MODULES = {Attention: "matmul", Router: "compute", RoutedExperts: "matmul",
                 SwiGLU: "matmul", RMSNorm: "compute"}


class Workload:
    def __init__(self, preset_name: str, seq_len: int, micro_batch: int):
        torch.manual_seed(0)
        self.model = MoEModel(preset(preset_name))
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-3)
        splits = load_tokens(DatasetSpec())
        self.loader = TokenLoader(splits.train, seq_len, micro_batch, 0, 1, seed=0)
        self.step = 0
        self.closing_s: list[float] = []  # step_end + aggregation, per timed step
        self.numel = sum(p.numel() for p in self.params)

    def train_step(self, timer: OpTimer | None,
                   aggregator: OpAggregator | None) -> tuple[float, float, StepTimings | None]:
        """One optimizer step: its wall time, its process CPU time and, timed, its timings."""

        def op(name: str, kind: str = "compute", **kw):
            return timer.op(name, kind=kind, **kw) if timer is not None else nullcontext()

        started, started_cpu = time.perf_counter(), time.process_time()
        self.step += 1
        with op("data", "data"):
            input_ids, labels = self.loader.next_batch()
        with op("forward"):
            output = self.model(input_ids, labels)
        with op("backward"):
            output.loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in self.params if p.grad is not None])
        with op("grad_all_reduce", "collective", nbytes=flat.numel() * 4, group="global",
                algo="native", collective="all_reduce", group_size=1):
            dist.all_reduce(flat)
        with op("grad_clip"):
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        with op("optimizer", "host"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        timings = None
        if timer is not None:
            closing = time.perf_counter()
            timings = timer.step_end(self.step)
            aggregator.aggregate(timings)
            self.closing_s.append(time.perf_counter() - closing)
        return time.perf_counter() - started, time.process_time() - started_cpu, timings


def per_op_cost_us(sample_every: int, n: int = 5_000) -> float:
    """What timing adds to one module call through the hooks (best of 5, so machine noise
    cannot inflate it): a timed nn.Identity call minus an untimed one."""
    x = torch.zeros(1)
    plain, hooked = torch.nn.Identity(), torch.nn.Identity()
    time_modules(hooked, OpTimer(sample_every=sample_every), {torch.nn.Identity: "compute"})

    def best_us(module: torch.nn.Module) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                module(x)
            best = min(best, (time.perf_counter() - start) / n * 1e6)
        return best

    return best_us(hooked) - best_us(plain)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=1, help="steps per mode per round")
    parser.add_argument("--sample-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    load_before = os.getloadavg()
    work = Workload(args.preset, args.seq_len, args.micro_batch)
    work.train_step(None, None)  # warm-up: allocator, first-call costs
    timers = {"always_on": OpTimer(0), "sampled": OpTimer(0, sample_every=args.sample_every)}
    aggregators = {mode: OpAggregator() for mode in timers}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu_times: dict[str, list[float]] = {mode: [] for mode in MODES}
    ops_per_step = 0
    for r in range(args.rounds):
        for mode in MODES[r % 3:] + MODES[:r % 3]:  # rotate who goes first
            timer = timers.get(mode)
            handles = (time_modules(work.model, timer, TIMED_MODULES) if timer is not None
                       else [])
            for _ in range(args.block):
                seconds, cpu_seconds, timings = work.train_step(timer, aggregators.get(mode))
                times[mode].append(seconds)
                cpu_times[mode].append(cpu_seconds)
                if timings is not None:
                    ops_per_step = sum(s.count for s in timings.ops.values())
            for h in handles:
                h.remove()
    load_after = os.getloadavg()
    dist.destroy_process_group()

    median_ms = {mode: statistics.median(t) * 1e3 for mode, t in times.items()}
    median_cpu_ms = {mode: statistics.median(t) * 1e3 for mode, t in cpu_times.items()}
    cost_us = {"always_on": per_op_cost_us(0), "sampled": per_op_cost_us(1)}
    closing_ms = statistics.median(work.closing_s) * 1e3
    share = 1 / args.sample_every
    sampled_cost_us = cost_us["always_on"] * (1 - share) + cost_us["sampled"] * share
    estimated = {  # sampled steps pay the ring record on top, one step in `sample_every`
        mode: (cost * ops_per_step / 1e3 + closing_ms) / median_ms["off"]
        for mode, cost in (("always_on_overhead", cost_us["always_on"]),
                           ("sampled_overhead", sampled_cost_us))
    }
    return {
        "benchmark": "timing_overhead",
        "workload": {"preset": args.preset, "seq_len": args.seq_len,
                     "micro_batch": args.micro_batch, "threads": args.threads,
                     "steps_per_mode": args.rounds * args.block,
                     "sample_every": args.sample_every, "timed_ops_per_step": ops_per_step,
                     "loop": "stand-in (real model, data, optimizer, gloo all-reduce)"},
        "median_step_ms": median_ms,
        "median_step_cpu_ms": median_cpu_ms,
        "timer_cost_per_op_us": cost_us,
        "step_end_and_aggregate_ms": closing_ms,
        "load_average": {"before": load_before[0], "after": load_after[0]},
        "ratios_clock": "process CPU time per step",
        "ratios": {mode + "_overhead": median_cpu_ms[mode] / median_cpu_ms["off"] - 1
                   for mode in MODES[1:]},
        "wall_ratios": {mode + "_overhead": median_ms[mode] / median_ms["off"] - 1
                        for mode in MODES[1:]},
        "estimated_from_cost_per_op": estimated,
    }


if __name__ == "__main__":
    json.dump(main(), sys.stdout, indent=2)
    print()
