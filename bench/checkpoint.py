"""Checkpoint cost: how long a save blocks training, and loading with resharding.

Side by side in one run, on the state PaRO checkpoints for a model (`--preset`, `tiny` by
default; `--layers` sets its depth): the parameters (fp32 master copy) and AdamW's two
moments, as three flat fp32 buffers of `param_count(config)` elements each, drawn at random
on `--device` (the model itself is not built, so a ling-mini-shaped state costs only its
buffers). On `--device cuda` they are the GPU state the sharded optimizer keeps there, and
our save copies them into pinned host memory (`state.staging` in the document).

- ours: `Checkpointer.save` with the memory tier (/dev/shm) and the disk tier; the time the
  call blocks, and the time until both tiers are persisted (`wait()`); also the time until a
  memory-only save is committed in /dev/shm (how fresh crash recovery on the host can be).
- `torch.save` of the same tensors (synchronous: it blocks for all of it), as people call it
  (into the page cache) and followed by an fsync (durable, as our disk tier is).
- DCP `async_save`: the time until it returns (its staging copy), and until its future is done.
- load (unless `--skip-load`): our checkpoint saved by 4 ranks (each a quarter of every
  buffer) loaded by 2 ranks (halves) and by 1 rank (everything) into buffers on `--device`,
  against `torch.load` and DCP `load` of the same state.
- crash recovery (unless `--skip-recovery`): a `tiny` CPU job restarted from the memory tier.

Every save is waited for before the next, so each figure is one save on an idle writer (the
steady state of a run that checkpoints less often than it takes to persist); on a GPU every
figure ends with a `torch.cuda.synchronize()`, so it includes the device's copies. Loads read
from the page cache (the files were just written). Prints one JSON document; a part skipped
has no ratios in it.

    python -m bench.checkpoint [--device cpu|cuda] [--preset tiny] [--layers N] [--repeats 5]
                               [--threads 1] [--dir DIR] [--skip-load] [--skip-recovery]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from engine.checkpoint import Checkpointer, load_into
from engine.moe.config import MoEConfig, param_count, preset
from engine.runtime.events import read_events
from engine.runtime.launch import RunTarget, launch
from engine.runtime.spec import parse_spec


def flat_state(config: MoEConfig, device: torch.device) -> dict[str, torch.Tensor]:
    """The three flat fp32 buffers of a model of `config`, at the scale of an initialised model
    and its moments (the values do not change what a save costs: nothing is compressed)."""
    numel = param_count(config)
    torch.manual_seed(0)
    return {
        "params": torch.randn(numel, device=device).mul_(config.initializer_range),
        "exp_avg": torch.randn(numel, device=device).mul_(1e-3),
        "exp_avg_sq": torch.rand(numel, device=device).mul_(1e-6),
    }


def settle() -> None:
    """Wait for the GPU's queued work, if this process uses a GPU."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> float:
    """Seconds `fn` takes, the GPU work it queues included."""
    settle()
    started = time.perf_counter()
    fn()
    settle()
    return time.perf_counter() - started


def durable_torch_save(state: dict, path: Path) -> None:
    """torch.save, then fsync: what it costs for the bytes to be on disk, as ours are."""
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def quarter(length: int, parts: int, index: int) -> tuple[int, int]:
    base, extra = divmod(length, parts)
    return index * base + min(index, extra), base + (index < extra)


def shards(state: dict[str, torch.Tensor], world: int, rank: int) -> dict:
    out = {}
    for name, t in state.items():
        offset, numel = quarter(t.numel(), world, rank)
        out[name] = (t[offset : offset + numel], offset, t.numel())
    return out


def progress(method: str, seconds: list[float]) -> None:
    """On stderr, so that a run stopped by its deadline still says where the time went."""
    print(f"{method}: {len(seconds)} saves, {sum(seconds):.1f} s", file=sys.stderr, flush=True)


def bench_save(state, root: Path, memory_dir: Path, repeats: int) -> dict:
    flat = {name: (t, 0, t.numel()) for name, t in state.items()}
    ours = Checkpointer(root / "ours", memory_dir=memory_dir, keep=2, memory_keep=1)
    ours_blocking, ours_persisted, memory_only_persisted = [], [], []
    settle()
    for step in range(1, repeats + 1):
        started = time.perf_counter()
        ours_blocking.append(ours.save(step, flat, {"step": step, "rng": torch.get_rng_state()}))
        ours.wait()
        ours_persisted.append(time.perf_counter() - started)
    for step in range(repeats + 1, 2 * repeats + 1):
        started = time.perf_counter()
        ours.save(step, flat, {"step": step}, to_disk=False)
        ours.wait()
        memory_only_persisted.append(time.perf_counter() - started)
    ours.close()
    progress("ours", ours_persisted)

    torch_save = [timed(lambda: torch.save(state, root / "torch.pt")) for _ in range(repeats)]
    torch_save_durable = [timed(lambda: durable_torch_save(state, root / "torch.pt"))
                          for _ in range(repeats)]
    progress("torch.save", torch_save_durable)

    dcp_blocking, dcp_total = [], []
    for i in range(repeats):
        settle()
        started = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=root / f"dcp-{i}")
        settle()  # its staging copy may still be queued on the GPU when it returns
        dcp_blocking.append(time.perf_counter() - started)
        future.result()
        dcp_total.append(time.perf_counter() - started)
    progress("DCP async", dcp_total)

    return {
        "ours_blocking_s": ours_blocking,
        "ours_persisted_s": ours_persisted,
        "ours_memory_tier_only_persisted_s": memory_only_persisted,
        "torch_save_s": torch_save,
        "torch_save_fsync_s": torch_save_durable,
        "dcp_async_blocking_s": dcp_blocking,
        "dcp_async_total_s": dcp_total,
    }


def bench_load(state, root: Path, repeats: int) -> dict:
    saved_world = 4
    writers = [
        Checkpointer(root / "sharded", rank=r, world_size=saved_world, run_id="bench",
                     memory_dir=None)
        for r in range(saved_world)
    ]
    for rank, ckpt in enumerate(writers):
        ckpt.save(1, shards(state, saved_world, rank))
    for ckpt in writers:
        ckpt.close()

    def load_as(world: int) -> list[float]:
        """Seconds per new rank (run one after another here; in a job they run at once)."""
        per_rank = []
        for rank in range(world):
            targets = {
                name: (torch.empty(numel, device=t.device), offset, t.numel())
                for name, t in state.items()
                for offset, numel in [quarter(t.numel(), world, rank)]
            }
            per_rank.append(timed(lambda targets=targets: load_into(root / "sharded", targets)))
            for name, (shard, offset, _) in targets.items():
                if not torch.equal(shard, state[name][offset : offset + shard.numel()]):
                    raise AssertionError(f"{name} loaded as rank {rank} of {world} differs")
        return per_rank

    empty = {name: torch.empty_like(t) for name, t in state.items()}
    return {
        "saved_world": saved_world,
        "ours_world2_per_rank_s": [max(load_as(2)) for _ in range(repeats)],
        "ours_world1_s": [load_as(1)[0] for _ in range(repeats)],
        "torch_load_s": [
            timed(lambda: torch.load(root / "torch.pt", weights_only=True))
            for _ in range(repeats)
        ],
        "dcp_load_s": [
            timed(lambda: dcp.load(empty, checkpoint_id=root / "dcp-0")) for _ in range(repeats)
        ],
    }


def crash_recovery_s(root: Path) -> float:
    """Seconds from a rank's death to the first new step: the `tiny` preset on 1x2 CPU ranks
    with memory snapshots every step, rank 1 killed (`os._exit`) at the start of step 12;
    the launcher restarts both ranks, which resume from the memory tier. Measured from rank
    0's last event before the death to the first step event after the restart."""
    spec = parse_spec({
        "name": "crash-recovery", "model": {"preset": "tiny"},
        "parallel": {"nodes": 1, "procs_per_node": 2},
        "train": {"steps": 14, "micro_batch": 2, "seq_len": 128, "eval_every": 0,
                  "device": "cpu"},
        "checkpoint": {"every": 0, "memory_every": 1},
        "faults": {"inject": [{"kind": "crash", "step": 12, "rank": 1}]},
    })
    target = RunTarget(run_dir=root / "crash", events_path=root / "crash" / "events.jsonl",
                       job=spec.name)
    if launch(spec, target) != 0:
        raise RuntimeError("the crash-recovery run did not complete")
    events = read_events(target.events_path)
    crash = next(e for e in events if e["type"] == "anomaly" and e["kind"] == "crash")
    died = max(e["time"] for e in events if e["seq"] < crash["seq"])
    first = next(e for e in events if e["type"] == "step" and e["seq"] > crash["seq"])
    return first["time"] - died


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the state lives")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--layers", type=int, default=None,
                        help="num_hidden_layers instead of the preset's")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--dir", default=None, help="disk folder for the files (a temp dir)")
    parser.add_argument("--skip-load", action="store_true", help="no load figures")
    parser.add_argument("--skip-recovery", action="store_true",
                        help="no crash-recovery run (a CPU job of two ranks)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU here")
    try:
        args.config = preset(args.preset)
    except KeyError as e:
        parser.error(str(e.args[0]))
    if args.layers is not None:
        args.config = args.config.replace(num_hidden_layers=args.layers)
    return args


def ratios(med: dict[str, float], recovery: float | None) -> dict[str, float]:
    """The comparisons of the parts that ran."""
    out = {
        "blocking_vs_torch_save": med["ours_blocking_s"] / med["torch_save_s"],
        "blocking_vs_dcp_async": med["ours_blocking_s"] / med["dcp_async_blocking_s"],
        "blocking_vs_torch_save_fsync": med["ours_blocking_s"] / med["torch_save_fsync_s"],
        # both tiers written, checksummed and fsynced, off the training thread
        "persisted_vs_torch_save_fsync": med["ours_persisted_s"] / med["torch_save_fsync_s"],
    }
    if "ours_world1_s" in med:
        out.update({
            "load_world1_vs_torch_load": med["ours_world1_s"] / med["torch_load_s"],
            "load_world2_rank_vs_torch_load": med["ours_world2_per_rank_s"] / med["torch_load_s"],
            "load_world1_vs_dcp_load": med["ours_world1_s"] / med["dcp_load_s"],
        })
    if recovery is not None:
        # seconds from a rank's death to the first new step (tiny, 1x2, memory tier)
        out["crash_recovery_s"] = recovery
    return out


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")  # DCP warns that no process group is initialised

    load_before = os.getloadavg()
    state = flat_state(args.config, torch.device(args.device))
    root = Path(tempfile.mkdtemp(prefix="bench-checkpoint-", dir=args.dir))
    memory_dir = Path("/dev/shm") / f"ringside-bench-{uuid.uuid4().hex[:8]}"
    state_bytes = sum(t.numel() * t.element_size() for t in state.values())
    shm_free = shutil.disk_usage("/dev/shm").free
    if shm_free < 2 * state_bytes:  # the memory tier keeps one save while it writes the next
        raise SystemExit(f"/dev/shm has {shm_free / 1e9:.1f} GB free; the memory tier needs "
                         f"{2 * state_bytes / 1e9:.1f} GB: choose a smaller --preset or --layers")
    try:
        save = bench_save(state, root, memory_dir, args.repeats)
        load = {} if args.skip_load else bench_load(state, root, args.repeats)
        recovery = None if args.skip_recovery else crash_recovery_s(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(memory_dir, ignore_errors=True)

    med = {key: statistics.median(values) for key, values in {**save, **load}.items()
           if isinstance(values, list)}
    on_gpu = state["params"].is_cuda
    print(json.dumps({
        "bench": "checkpoint",
        "state": {
            "preset": args.preset,
            "num_hidden_layers": args.config.num_hidden_layers,
            "device": str(state["params"].device),
            # Checkpointer.save copies GPU shards into a pinned host buffer, CPU ones into a
            # pageable one
            "staging": "pinned" if on_gpu else "pageable",
            "elements_per_buffer": state["params"].numel(),
            "buffers": list(state),
            "bytes": state_bytes,
        },
        "machine": {"cpus": os.cpu_count(), "torch_threads": args.threads,
                    "gpu": torch.cuda.get_device_name() if on_gpu else None,
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "repeats": args.repeats,
        "median_s": med,
        "samples_s": {**save, **load},
        "ratios": ratios(med, recovery),
    }, indent=2))


if __name__ == "__main__":
    main()
