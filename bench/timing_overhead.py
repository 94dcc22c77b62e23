"""What per-op timing costs the real training loop: off, always-on (L1), sampled (L2).

    .venv/bin/python -m bench.timing_overhead [--device cpu|cuda] [--preset tiny] [--layers N]
                                              [--ranks 2] [--rounds 10] [--block 10]
                                              [--sample-every 10]

Every rank runs the engine's own `Trainer` (the model, PaRO data parallelism over gloo, or
NCCL on GPUs, the fault detectors, the cross-rank aggregation of the `ops` event) and switches
its timing between steps with `Trainer.set_timing`. On `--device cuda` (one rank per GPU, 1 by
default) the Trainer's timer times ops with CUDA events on the op's stream (its `cuda` backend):

- off: `OpTimer` hands out no-op spans and the module hooks are removed;
- always_on: every op timed and aggregated across ranks every step, no timeline;
- sampled: as always_on, plus the full per-op timeline of every `--sample-every`-th step
  recorded and written as a Chrome trace (the default in a job is every 500th step, so this
  is a harsher setting than the default).

The modes take turns in blocks of `--block` steps (a block as long as the sampling period,
so a sampled block holds its share of sampled steps) and rotate which goes first, so drift and
machine noise fall on all of them alike. The overhead of a mode is its median block-mean step
time over that of "off", in process CPU time (`cpu_ratios`: on a shared machine it is not
inflated by other tenants) and in wall-clock time (`wall_ratios`); `ratios` is the headline,
the CPU-time one on the CPU and the wall-clock one on a GPU (where the step's cost is the
device's work, and a block is timed from one `torch.cuda.synchronize()` to the next), with the
standard error that says what the comparison can resolve. A CPU step varies by +-15% from
step to step, more than timing costs, so `accounted` adds the same overheads from unit costs
measured in isolation: the cost of one timed call (its host-side hooks and span) times the
timed calls per step, plus one trace write per sampling period. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from engine.ports import free_port
from engine.runtime.spec import parse_spec
from engine.runtime.train import Trainer
from engine.xputimer import OpTimer, time_modules, write_trace

MODES = ("off", "always_on", "sampled")


def spec_for(args: argparse.Namespace) -> dict:
    model = {"preset": args.preset}
    if args.layers is not None:
        model["num_hidden_layers"] = args.layers
    return {
        "name": "timing-overhead",
        "model": model,
        "parallel": {"nodes": 1, "procs_per_node": args.ranks},
        "train": {"steps": 100_000, "micro_batch": args.micro_batch, "seq_len": args.seq_len,
                  "eval_every": 0, "threads": args.threads, "trace_every": args.sample_every,
                  "device": args.device},
        "checkpoint": {"every": 0},
    }


def rank_main(rank: int, args: argparse.Namespace, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    trainer = Trainer(parse_spec(spec_for(args)), Path(out_dir) / "run")
    for _ in range(3):  # warm-up: allocator, first-call costs
        trainer.train_step()
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    sampled_steps = {m: 0 for m in MODES}
    ops_per_step = 0
    # on a GPU a block's time is its device work: the queue is drained at both ends
    settle = torch.cuda.synchronize if args.device == "cuda" else lambda: None
    for r in range(args.rounds):
        for mode in MODES[r % 3:] + MODES[: r % 3]:
            trainer.set_timing(mode != "off")
            trainer.timer.sample_every = args.sample_every if mode == "sampled" else 0
            settle()
            started, started_cpu = time.perf_counter(), time.process_time()
            for _ in range(args.block):
                trainer.train_step()
                last = trainer.last_timings
                sampled_steps[mode] += last.sampled
                if mode == "always_on":
                    ops_per_step = sum(s.count for s in last.ops.values())
            settle()
            wall[mode].append((time.perf_counter() - started) / args.block)
            cpu[mode].append((time.process_time() - started_cpu) / args.block)
    trace_s = time_trace(trainer, Path(out_dir) / "probe.json")
    trainer.finish()
    report = {"wall": wall, "cpu": cpu, "sampled_steps": sampled_steps,
              "ops_per_step": ops_per_step, "trace_s": trace_s,
              "op_s": {mode: timed_call_cost(mode == "sampled") for mode in MODES[1:]}}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))


def timed_call_cost(sampled: bool, calls: int = 20_000) -> float:
    """Seconds one timed module call adds over an untimed one: the forward hooks and the span
    (in sampled steps the span also writes the timeline ring). Every op is charged this,
    although the loop's explicit ops skip the hooks."""
    layer = nn.Sequential(nn.Identity())
    x = torch.zeros(1)

    def run() -> float:
        started = time.perf_counter()
        for i in range(calls):
            layer(x)
            if i % 100 == 99:
                timer.step_end(i // 100 + 1)
        return time.perf_counter() - started

    timer = OpTimer(enabled=False)
    plain = min(run() for _ in range(3))
    timer = OpTimer(sample_every=1 if sampled else 0)
    time_modules(layer, timer, {nn.Identity: "compute"})
    timed = min(run() for _ in range(3))
    return (timed - plain) / calls


def time_trace(trainer: Trainer, path: Path) -> float:
    """Seconds to gather and write one sampled step's timeline of every rank (collective)."""
    step = int(trainer.timer.ring.snapshot(None)["step"].max())
    dist.barrier()
    started = time.perf_counter()
    write_trace(trainer.timer, path, steps={step})
    dist.barrier()
    return time.perf_counter() - started


def accounted(ranks: list[dict], step_s: float, args: argparse.Namespace) -> dict[str, float]:
    ops = ranks[0]["ops_per_step"]
    op_s = {mode: max(r["op_s"][mode] for r in ranks) for mode in MODES[1:]}
    trace_s = ranks[0]["trace_s"]
    return {
        "timed_call_us": {mode: cost * 1e6 for mode, cost in op_s.items()},
        "trace_ms_per_sampled_step": trace_s * 1e3,
        "always_on_overhead": ops * op_s["always_on"] / step_s,
        "sampled_overhead": (ops * op_s["sampled"] + trace_s / args.sample_every) / step_s,
    }


def overheads(per_block: dict[str, list[float]]) -> dict[str, float]:
    median = {mode: statistics.median(values) for mode, values in per_block.items()}
    return {f"{mode}_overhead": median[mode] / median["off"] - 1 for mode in MODES[1:]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--layers", type=int, default=None,
                        help="num_hidden_layers instead of the preset's")
    parser.add_argument("--ranks", type=int, default=None,
                        help="ranks on this host (default: 2 on cpu, 1 on cuda)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=10, help="steps per mode per round")
    parser.add_argument("--sample-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.ranks is None:
        args.ranks = 1 if args.device == "cuda" else 2
    if args.device == "cuda" and args.ranks > torch.cuda.device_count():
        parser.error(f"--ranks {args.ranks} needs as many GPUs (one per rank), "
                     f"this machine has {torch.cuda.device_count()}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    # the headline clock: a GPU step's cost is the device's time, not the host process's
    headline = "wall" if args.device == "cuda" else "cpu"
    port = free_port()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(rank_main, args=(args, port, out_dir), nprocs=args.ranks)
        ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text())
                 for r in range(args.ranks)]
        traces = [p.stat().st_size for p in Path(out_dir, "run", "traces").glob("*.json")]
    load_after = os.getloadavg()[0]
    # a step costs what its slowest rank costs: take the mean over ranks of each block
    per_block = {clock: {mode: [statistics.fmean(r[clock][mode][i] for r in ranks)
                                for i in range(args.rounds)] for mode in MODES}
                 for clock in ("cpu", "wall")}
    return {
        "benchmark": "timing_overhead",
        "workload": {"loop": "engine.runtime.train.Trainer (real)", "device": args.device,
                     "preset": args.preset, "layers": args.layers, "ranks": args.ranks,
                     "seq_len": args.seq_len, "micro_batch": args.micro_batch,
                     "threads_per_rank": args.threads, "steps_per_mode": args.rounds * args.block,
                     "sample_every": args.sample_every,
                     "timed_ops_per_step": ranks[0]["ops_per_step"],
                     "sampled_steps": ranks[0]["sampled_steps"]},
        "median_step_ms": {mode: statistics.median(per_block["wall"][mode]) * 1e3
                           for mode in MODES},
        "median_step_cpu_ms": {mode: statistics.median(per_block["cpu"][mode]) * 1e3
                               for mode in MODES},
        "trace_mb_per_rank_per_sampled_step": {
            "max": max(traces) / args.ranks / 1e6, "traces": len(traces), "budget": 2.0},
        "load_average": {"before": load_before, "after": load_after},
        # the same overheads from unit costs measured in isolation, immune to machine noise:
        # timed ops per step x the cost of one, plus one trace per sampling period
        "accounted": accounted(ranks, statistics.median(per_block["wall"]["off"]), args),
        "ratios_clock": {"cpu": "process CPU time per step, mean over ranks",
                         "wall": "wall-clock time per step, mean over ranks"}[headline],
        "ratios": overheads(per_block[headline]),
        # what the A/B comparison can resolve: the standard error of a mode's block mean,
        # as a fraction of the step (block-to-block spread of "off" / sqrt(rounds))
        "ratios_standard_error": statistics.stdev(per_block[headline]["off"])
        / statistics.median(per_block[headline]["off"]) / args.rounds ** 0.5,
        "cpu_ratios": overheads(per_block["cpu"]),
        "wall_ratios": overheads(per_block["wall"]),
        "targets": {"always_on_overhead": 0.005, "sampled_overhead": 0.01},
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    json.dump(main(), sys.stdout, indent=2)
    print()
