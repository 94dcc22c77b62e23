"""How well the planner predicts a real step: its step time against the engine's own.

    .venv/bin/python -m bench.planner_accuracy [--presets tiny small] [--steps 8]
                                               [--micro-batch 4] [--seq-len 256]

For each preset and layout (1x2 and 2x2 ranks on this host) it runs the engine CLI
(`python -m engine.train spec.json`, strategy NNN, a few steps) and takes the median step time
of its `step` events (the first step, with its allocations, left out). The planner predicts
the same step (compute + the cost model's communication on this host's links + the
optimizer) with the compute from each of the platform's two sources (jobs.calibration):

- calibrated: the model's FLOPs per token over this host's training rate, with the links,
  measured once here by `engine.paro.calibrate` as the platform's calibration task does;
- measured: the device's training FLOP/s in the *other* layout's run of the same preset (its
  `ops` events: a rank's step less collectives and data wait), as a job of the same model
  would give the platform; one layout's run never predicts itself.

`ratios` are predicted / measured per preset, layout and source (1.0 is exact). CPU steps
slow down with the machine's load: run it on a quiet machine; the document records the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.horing.cost import Links, Tier
from engine.horing.topology import Topology
from engine.moe.config import preset
from engine.paro.calibrate import host_links, training_flops_per_s
from engine.paro.planner import compute_time_s, effective_flops_per_s, plan, ranks_per_device

LAYOUTS = ((1, 2), (2, 2))
STRATEGY = "NNN"


def run_engine(name: str, preset_name: str, layout: tuple[int, int], args, workdir: Path) -> dict:
    """Train a few steps; the median step time and median-rank compute of the steps after
    the first."""
    spec = {"name": name, "model": {"preset": preset_name},
            "parallel": {"nodes": layout[0], "procs_per_node": layout[1], "strategy": STRATEGY},
            "train": {"steps": args.steps, "micro_batch": args.micro_batch,
                      "seq_len": args.seq_len, "eval_every": 0, "trace_every": 0},
            "checkpoint": {"every": 0}}
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(spec))
    subprocess.run([sys.executable, "-m", "engine.train", str(path)], cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.getcwd()})
    events = [json.loads(line)
              for line in (workdir / "runs" / name / "events.jsonl").read_text().splitlines()]
    later = [e for e in events if e.get("step", 0) > 1]
    return {
        "step_s": statistics.median(e["step_time"] for e in later if e["type"] == "step"),
        "compute_s": statistics.median(
            statistics.median(r["compute_ms"] for r in e["ranks"]) / 1e3
            for e in later if e["type"] == "ops"),
    }


def predicted(preset_name: str, layout: tuple[int, int], flops_per_s: float, links: Links,
              args) -> float:
    config, world = preset(preset_name), layout[0] * layout[1]
    compute = compute_time_s(config, args.seq_len, args.micro_batch, flops_per_s,
                             ranks_per_device(world, "cpu"))
    rows = plan(config, Topology(*layout), float("inf"), 1, links,
                compute_time_s=compute, dtype_bytes=4)
    return next(r.step_time_s for r in rows if r.strategy == STRATEGY)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    host_rate = training_flops_per_s()
    measured_links = host_links()
    links = Links(**{tier: Tier(**t) for tier, t in measured_links.items()})
    table, ratios = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.presets:
            runs = {layout: run_engine(f"acc-{name}-{layout[0]}x{layout[1]}", name, layout,
                                       args, Path(tmp)) for layout in LAYOUTS}
            for layout, run in runs.items():
                other = next(o for o in LAYOUTS if o != layout)
                tokens = args.micro_batch * args.seq_len
                measured_rate = effective_flops_per_s(
                    preset(name), args.seq_len, tokens, runs[other]["compute_s"],
                    ranks_per_device(other[0] * other[1], "cpu"))
                for source, rate in (("calibrated", host_rate), ("measured", measured_rate)):
                    guess = predicted(name, layout, rate, links, args)
                    key = f"{name} {layout[0]}x{layout[1]} {source}"
                    ratios[key] = guess / run["step_s"]
                    table.append({"preset": name, "layout": f"{layout[0]}x{layout[1]}",
                                  "strategy": STRATEGY, "source": source,
                                  "flops_per_s": rate, "predicted_s": guess,
                                  "measured_s": run["step_s"],
                                  "measured_compute_s": run["compute_s"],
                                  "ratio": ratios[key]})
    print(json.dumps({"benchmark": "planner_accuracy", "host_flops_per_s": host_rate,
                      "links": measured_links,
                      "micro_batch": args.micro_batch, "seq_len": args.seq_len,
                      "steps": args.steps, "cpus": os.cpu_count(),
                      "load_before": load_before, "load_after": os.getloadavg()[0],
                      "table": table, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
