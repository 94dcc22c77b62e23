"""Export cost: seconds and peak memory of `python -m engine.export` against the checkpoint.

Trains the `small` preset for a couple of steps on 2 nodes x 2 ranks with a sharded strategy
(IIG, CPU), so the checkpoint is four ranks' shards of the parameters and AdamW's moments,
then exports it twice in fresh processes: with the default shard size (the whole model in
one safetensors file here) and with small shards. The peak RSS of each export process is
read from its own rusage (`os.wait4`), and set against a process that only imports what the
exporter imports, so the figures separate the streaming's cost from the libraries' floor.
Prints one JSON document.

    python -m bench.export [--steps 2] [--layers 8] [--shard-size 64MB] [--dir DIR]
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
from engine.moe.config import preset
from engine.moe.model import param_count

REPO = Path(__file__).resolve().parents[1]
IMPORTS = "import engine.export, transformers, safetensors.torch, huggingface_hub"


def make_checkpoint(root: Path, steps: int, layers: int) -> tuple[Path, Path]:
    spec = {
        "name": "bench-export", "model": {"preset": "small", "num_hidden_layers": layers},
        "parallel": {"nodes": 2, "procs_per_node": 2, "strategy": "IIG"},
        "train": {"steps": steps, "micro_batch": 2, "seq_len": 64, "warmup": 1,
                  "eval_every": 0, "device": "cpu"},
        "checkpoint": {"every": 0},
    }
    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps(spec))
    subprocess.run([sys.executable, "-m", "engine.train", str(spec_path), "--run-dir",
                    str(root / "run")], cwd=REPO, check=True, capture_output=True)
    return resolve(root / "run" / "checkpoints").path, spec_path


def measured(args: list[str]) -> dict[str, float]:
    """Wall seconds and peak RSS (bytes) of one child process, from its own rusage."""
    started = time.perf_counter()
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(args)} failed with status {status}")
    return {"seconds": round(seconds, 3), "peak_rss_bytes": usage.ru_maxrss * 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="training steps before the save")
    parser.add_argument("--layers", type=int, default=preset("small").num_hidden_layers)
    parser.add_argument("--shard-size", default="64MB", help="the small shard size (64MB)")
    parser.add_argument("--dir", default=None, help="folder for the run and the exports")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-export-", dir=args.dir))
    try:
        train_started = time.perf_counter()
        checkpoint, spec_path = make_checkpoint(root, args.steps, args.layers)
        train_s = time.perf_counter() - train_started
        info = resolve(checkpoint)
        floor = measured([sys.executable, "-c", IMPORTS])
        runs = {}
        for label, shard_size in (("one_shard", "5GB"), ("small_shards", args.shard_size)):
            out = root / f"hf-{label}"
            runs[label] = measured([sys.executable, "-m", "engine.export", str(checkpoint),
                                    str(out), "--spec", str(spec_path),
                                    "--max-shard-size", shard_size])
            files = sorted(out.glob("*.safetensors"))
            runs[label] |= {"shard_size": shard_size, "files": len(files),
                            "largest_file_bytes": max(f.stat().st_size for f in files),
                            "exported_bytes": sum(f.stat().st_size for f in files)}
    finally:
        shutil.rmtree(root, ignore_errors=True)

    config = preset("small").replace(num_hidden_layers=args.layers)
    ckpt_bytes = info.size
    print(json.dumps({
        "bench": "export",
        "model": {"preset": "small", "num_hidden_layers": args.layers,
                  "parameters": param_count(config),
                  "exported_parameters": param_count(config.replace(num_nextn_predict_layers=0))},
        "checkpoint": {"bytes": ckpt_bytes, "world_size": info.world_size,
                       "strategy": info.strategy, "step": info.step},
        "machine": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()},
        "train_s": round(train_s, 1),
        "import_floor": floor,
        "exports": runs,
        "ratios": {
            f"{label}_{name}": round(value, 4) for label, r in runs.items() for name, value in {
                "peak_rss_over_checkpoint_bytes": r["peak_rss_bytes"] / ckpt_bytes,
                "peak_rss_over_exported_bytes": r["peak_rss_bytes"] / r["exported_bytes"],
                # what the export holds beyond the libraries it imports
                "rss_above_imports_over_largest_file": (
                    (r["peak_rss_bytes"] - floor["peak_rss_bytes"]) / r["largest_file_bytes"]),
                "seconds_above_imports": r["seconds"] - floor["seconds"],
            }.items()
        },
    }, indent=2))


if __name__ == "__main__":
    main()
