"""What the MoE benchmarks share: where they run and how they time implementations side by side.

By default on the CPU in fp32 at 2 threads (the issue's setting); `--device cuda` runs on the
GPU in bf16. Implementations are timed round-robin, one call of each per round, so that a
change in the machine's load hits them alike; on a GPU every call is followed by a
synchronisation, so a time is the whole call, launches included, as a training step sees it.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.moe import cast_parameters

CPU_THREADS = 2
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Target:
    device: torch.device
    dtype: torch.dtype

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.on_cuda:
            torch.cuda.synchronize(self.device)

    def describe(self) -> dict:
        """The JSON fields that say where a document's figures were taken."""
        where = {
            "device": self.device.type,
            "dtype": str(self.dtype).removeprefix("torch."),
            "torch": torch.__version__,
        }
        if self.on_cuda:
            where["gpu"] = torch.cuda.get_device_name(self.device)
        else:
            where["threads"] = torch.get_num_threads()
            where["machine"] = platform.processor() or platform.machine()
        return where


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where to run (default cpu)")
    parser.add_argument("--dtype", choices=tuple(DTYPES),
                        help="default float32 on cpu, bfloat16 on cuda")


def target_from_args(args: argparse.Namespace) -> Target:
    """The device and dtype the arguments name; on the CPU also pins the thread count."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    dtype = DTYPES[args.dtype or ("bfloat16" if args.device == "cuda" else "float32")]
    if args.device == "cpu":
        torch.set_num_threads(CPU_THREADS)
    return Target(torch.device(args.device), dtype)


def on_target(module: torch.nn.Module, target: Target) -> torch.nn.Module:
    """The module on the target device with its parameters in the target dtype; buffers keep
    theirs (both libraries keep routing state in fp32), as the engine trains on a GPU."""
    return cast_parameters(module.to(target.device), target.dtype)


def time_round_robin(
    fns: dict[str, Callable[[], object]], rounds: int, target: Target
) -> dict[str, list[float]]:
    """Milliseconds per call of each function, one call of each per round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            target.sync()
            start = time.perf_counter()
            fn()
            target.sync()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def write_profile(fn: Callable[[], object], target: Target, path: Path, calls: int = 3) -> None:
    """torch.profiler's table of `calls` calls of `fn` (already warm), the ops that took the
    most device time first (host time on a CPU): what stands between a layer and the limit."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if target.on_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(calls):
            fn()
        target.sync()
    sort_by = "self_cuda_time_total" if target.on_cuda else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profiler.key_averages().table(sort_by=sort_by, row_limit=30))
