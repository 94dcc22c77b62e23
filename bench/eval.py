"""Evaluation throughput against slots: items scored per second by 1, 2 and 4 slots.

Trains a small model for a couple of steps on one CPU rank, then evaluates its checkpoint on
the same items (held-out windows and a task file of continuations and multiple-choice
items) with S slots: S `python -m engine.evaluate` processes over disjoint item ranges at
once, each with `--threads` torch threads, as the platform's elastic evaluation runs them
(jobs.evaluations). Wall time counts each slot's start (imports, the checkpoint's load), as
a slot the platform starts pays it. Checks that every run's summary is the one-slot run's.
Prints one JSON document; `ratios` are items/s at S slots over items/s at 1.

    python -m bench.eval [--slots 1 2 4] [--windows 64] [--tasks 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.checkpoint.reader import resolve
from engine.data.loader import split_evenly

REPO = Path(__file__).resolve().parents[1]
TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n"


def make_checkpoint(root: Path, model: str) -> tuple[Path, Path]:
    (root / "data.txt").write_text(TEXT * 400)
    spec = {"name": "bench-eval", "model": {"preset": model},
            "train": {"steps": 2, "micro_batch": 2, "seq_len": 64, "warmup": 1,
                      "eval_every": 0, "device": "cpu",
                      "dataset": {"kind": "text", "paths": [str(root / "data.txt")],
                                  "tokenizer": "bytes", "holdout": 0.2}},
            "checkpoint": {"every": 0}}
    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps(spec))
    subprocess.run([sys.executable, "-m", "engine.train", str(spec_path), "--run-dir",
                    str(root / "run")], cwd=REPO, check=True, capture_output=True)
    return resolve(root / "run" / "checkpoints").path, spec_path


def write_tasks(path: Path, count: int) -> None:
    lines = []
    for i in range(count):
        if i % 2:
            lines.append({"prompt": "def add(a, b):\n    return", "continuation": " a + b"})
        else:
            lines.append({"prompt": "class Point:\n    x: int =", "choices": [" 0", " 1", " x"],
                          "answer": 0})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def run(engine: list[str], slots: int, total: int) -> tuple[float, dict]:
    """Wall seconds of `slots` processes over even item ranges, and the summary after."""
    sizes, start, processes = split_evenly(total, slots), 0, []
    started = time.perf_counter()
    for size in sizes:
        processes.append(subprocess.Popen(
            [*engine, "--items", f"{start}:{start + size}"], cwd=REPO,
            stdout=subprocess.DEVNULL))
        start += size
    if any(p.wait() for p in processes):
        raise RuntimeError(f"a slot of the {slots}-slot run failed")
    seconds = time.perf_counter() - started
    summary = subprocess.run([*engine, "--items", "0:0"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
    return seconds, json.loads(summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--windows", type=int, default=64, help="held-out windows")
    parser.add_argument("--tasks", type=int, default=64, help="task items")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per slot")
    parser.add_argument("--model", default="tiny", help="model preset (tiny)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    try:
        checkpoint, spec_path = make_checkpoint(root, args.model)
        write_tasks(root / "tasks.jsonl", args.tasks)
        options = ["--spec", str(spec_path), "--tasks", str(root / "tasks.jsonl"),
                   "--heldout-windows", str(args.windows), "--threads", str(args.threads)]
        runs, summaries = {}, {}
        for slots in args.slots:
            out = root / f"slots-{slots}"
            engine = [sys.executable, "-m", "engine.evaluate", str(checkpoint), str(out),
                      *options]
            seconds, summaries[slots] = run(engine, slots, args.windows + args.tasks)
            total = summaries[slots]["items_total"]
            runs[slots] = {"seconds": round(seconds, 3), "items": total,
                           "items_per_s": round(total / seconds, 3)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    first = args.slots[0]
    print(json.dumps({
        "bench": "eval", "model": args.model, "threads_per_slot": args.threads,
        "cpus": os.cpu_count(), "runs": runs,
        "same_scores_as_one_slot": all(s == summaries[first] for s in summaries.values()),
        "ratios": {f"eval_items_per_s_vs_slots_{s}": round(
            runs[s]["items_per_s"] / runs[first]["items_per_s"], 3) for s in args.slots},
    }, indent=2))


if __name__ == "__main__":
    main()
