"""False alarms: destructive actions the fault policy takes on healthy runs on a busy host,
under today's defaults and under the previous ones, side by side.

    .venv/bin/python -m bench.false_alarms [--steps 1500] [--busy 2] [--presets nano tiny]
                                           [--layouts 1x2 2x2]

Each healthy run (no fault injected; `--steps` steps of 8 sequences of 64 tokens a rank, no
checkpoints) trains once with each set of defaults while `--busy` processes spin on the CPU
beside it, as other jobs and tests do on a shared machine. A destructive action is one that
costs work or stops the run: skip_update, retry_step, lr_cut, rollback, reshard, exclude,
restart, pause, cancel (observe, rebalance, rerun and checkpoint cost none). "Previous" is the
policy before the quieter defaults: a loss spike at z 3 and 1.25x its running mean, a grad-norm
spike at 3x, on the engine of commit PREVIOUS_ENGINE (git archive), whose straggler detector judged
wall-clock compute, a rank's wait for a core included (today's leaves out what a rank waited
for a core beyond the others). Prints one JSON
document; `ratios.destructive_current_vs_previous` is today's count over the previous one's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from engine.runtime.events import read_events

DESTRUCTIVE = ("skip_update", "retry_step", "lr_cut", "rollback", "reshard", "exclude",
               "restart", "pause", "cancel")
# the spike thresholds before the quieter defaults (git log -p engine/anomaly/policy.py)
PREVIOUS_THRESHOLDS = {"loss_spike": {"z": 3.0, "min_rise": 0.25},
                       "grad_spike": {"z": 4.0, "min_rise": 2.0}}
# the engine before its straggler detector left out a rank's extra wait for a core
PREVIOUS_ENGINE = "8e4fa2f"
REPO = Path(__file__).resolve().parent.parent
LAUNCH = """
import json, sys
from pathlib import Path
from engine.runtime.launch import RunTarget, launch
from engine.runtime.spec import parse_spec
if __name__ == "__main__":
    data, root = json.loads(sys.argv[1]), Path(sys.argv[2])
    launch(parse_spec(data), RunTarget(run_dir=root / data["name"],
                                       events_path=root / (data["name"] + ".jsonl"),
                                       job=data["name"]))
"""


def spin() -> None:
    while True:
        pass


def spec(name: str, preset: str, layout: str, steps: int, previous: bool) -> dict[str, Any]:
    nodes, procs = (int(n) for n in layout.split("x"))
    policy = {"thresholds": PREVIOUS_THRESHOLDS} if previous else {}
    return {"name": name, "model": {"preset": preset},
            "parallel": {"nodes": nodes, "procs_per_node": procs, "strategy": "NNG"},
            "train": {"steps": steps, "micro_batch": 8, "seq_len": 64, "lr": 1e-3,
                      "eval_every": 0, "threads": 1},
            "checkpoint": {"every": 0}, "faults": {"policy": policy}}


def previous_engine(root: Path) -> Path:
    """The previous engine's sources, from git, beside the runs."""
    tree = root / "previous"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS_ENGINE, "engine"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def healthy_run(root: Path, preset: str, layout: str, steps: int,
                engine_root: Path | None) -> dict[str, Any]:
    """One healthy run, under the previous engine and thresholds where `engine_root` is
    given (a process of its own, so its ranks import that engine)."""
    name = f"{preset}-{layout}-{'previous' if engine_root else 'current'}"
    data = spec(name, preset, layout, steps, previous=engine_root is not None)
    env = {**os.environ, "PYTHONPATH": str(engine_root or REPO)}
    subprocess.run([sys.executable, "-c", LAUNCH, json.dumps(data), str(root)], env=env,
                   cwd=engine_root or REPO, check=False, stdout=subprocess.DEVNULL)
    events = read_events(root / f"{name}.jsonl")
    destructive = [e for e in events if e["type"] == "action" and e["action"] in DESTRUCTIVE]
    return {"steps": len({e["step"] for e in events if e["type"] == "step"}),
            "state": next(e["state"] for e in reversed(events) if e["type"] == "state"),
            "anomalies": _count(e["kind"] for e in events if e["type"] == "anomaly"),
            "destructive": len(destructive),
            "destructive_by_action": _count(e["action"] for e in destructive),
            "first_destructive_step": destructive[0]["step"] if destructive else None}


def _count(names) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--presets", nargs="+", default=["nano", "tiny"])
    parser.add_argument("--layouts", nargs="+", default=["1x2", "2x2"])
    args = parser.parse_args()
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for process in spinners:
        process.start()
    runs: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            previous_root = previous_engine(Path(tmp))
            for preset in args.presets:
                for layout in args.layouts:
                    for previous in (False, True):
                        key = f"{preset}-{layout}-{'previous' if previous else 'current'}"
                        runs[key] = healthy_run(Path(tmp), preset, layout, args.steps,
                                                previous_root if previous else None)
                        print(key, runs[key], file=sys.stderr, flush=True)
    finally:
        for process in spinners:
            process.terminate()
    current = sum(r["destructive"] for k, r in runs.items() if k.endswith("current"))
    previous = sum(r["destructive"] for k, r in runs.items() if k.endswith("previous"))
    print(json.dumps({
        "bench": "false_alarms", "machine": platform.node(), "steps": args.steps,
        "previous_engine": PREVIOUS_ENGINE,
        "busy_processes": args.busy, "runs": runs,
        "destructive_current": current, "destructive_previous": previous,
        "ratios": {"destructive_current_vs_previous":
                   current / previous if previous else None},
    }, indent=2))


if __name__ == "__main__":
    main()
