"""Warm pause against cold: from a `resume` to the next step event (issue "Steer live and take
the model out": a warm resume within 1 s).

One run of the CLI (`python -m engine.train`, nano, two gloo ranks) is paused warm and resumed
`--cycles` times; each figure is the time from writing `resume` into the control file to the
engine's next `step` event (its own event time). Side by side, another run of the same spec is
paused cold and resumed `--cycles` times: from writing `pause` to the process's exit, and from
starting `--resume` to its first step event. Prints one JSON document.

    python -m bench.warm_pause [--cycles 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.contract import ExitCode
from engine.runtime.control import send

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 1.0
Event = dict[str, Any]


def spec(name: str) -> dict[str, Any]:
    """Nano on two ranks, long enough for every cycle; no scheduled checkpoint, so a cold
    pause's checkpoint is the only one."""
    return {"name": name, "model": {"preset": "nano"},
            "parallel": {"nodes": 1, "procs_per_node": 2, "strategy": "NNN"},
            "train": {"steps": 100_000, "micro_batch": 2, "seq_len": 64, "eval_every": 0,
                      "threads": 1},
            "checkpoint": {"every": 1_000_000}}


class Engine:
    """One launch of the CLI on a run folder; its events read as they are appended."""

    def __init__(self, root: Path, name: str, *extra: str):
        self.run_dir = root / name
        self.run_dir.mkdir(parents=True, exist_ok=True)
        spec_path = root / f"{name}.json"
        spec_path.write_text(json.dumps(spec(name)))
        events = self.run_dir / "events.jsonl"
        self.events = events.open("a+", encoding="utf-8")
        self.events.seek(0, os.SEEK_END)  # an earlier launch's events are not this one's
        self.console = (root / f"{name}.log").open("a")
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.train", str(spec_path), "--run-dir",
             str(self.run_dir), *extra], cwd=REPO_ROOT, stdout=self.console,
            stderr=subprocess.STDOUT)

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 300) -> Event:
        """The next event that matches (those before it are passed over)."""
        deadline, partial = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            partial += self.events.readline()
            if not partial.endswith("\n"):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the engine exited ({self.proc.returncode})")
                time.sleep(0.005)
                continue
            event, partial = json.loads(partial), ""
            if predicate(event):
                return event
        raise TimeoutError("no such event")

    def command(self, kind: str, **args: Any) -> float:
        """Write a command into the control file; returns when (wall clock)."""
        sent = time.time()
        send("", kind, args, run_dir=self.run_dir, command_id=f"{kind}-{sent}")
        return sent

    def exit(self) -> int:
        code = self.proc.wait(timeout=300)
        self.events.close()
        self.console.close()
        return code


def is_step(event: Event) -> bool:
    return event["type"] == "step"


def is_state(state: str) -> Callable[[Event], bool]:
    return lambda event: event["type"] == "state" and event["state"] == state


def warm_cycles(root: Path, cycles: int) -> list[dict[str, float]]:
    engine = Engine(root, "warm")
    figures = []
    try:
        for _ in range(cycles):
            for _ in range(3):
                engine.wait_for(is_step)
            sent = engine.command("pause", mode="warm", max_s=600)
            paused = engine.wait_for(is_state("paused"))
            time.sleep(0.5)  # idle a while: the resume is not caught mid-pause
            resumed = engine.command("resume")
            step = engine.wait_for(is_step)
            figures.append({"pause_s": round(paused["time"] - sent, 3),
                            "resume_s": round(step["time"] - resumed, 3)})
        engine.command("cancel")
        engine.wait_for(is_state("cancelled"))
    finally:
        engine.proc.kill()
        engine.exit()
    return figures


def cold_cycles(root: Path, cycles: int) -> list[dict[str, float]]:
    engine, figures = Engine(root, "cold"), []
    for _ in range(cycles):
        for _ in range(3):
            engine.wait_for(is_step)
        sent = engine.command("pause")
        if engine.exit() != ExitCode.PAUSED:
            raise RuntimeError("the cold pause did not end with ExitCode.PAUSED")
        stopped = time.time()
        engine = Engine(root, "cold", "--resume", str(engine.run_dir / "checkpoints"))
        step = engine.wait_for(is_step)
        figures.append({"pause_s": round(stopped - sent, 3),
                        "resume_s": round(step["time"] - engine.started, 3)})
    engine.proc.kill()
    engine.exit()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ringside-warm-pause-"))
    try:
        load_before = os.getloadavg()
        warm = warm_cycles(root, args.cycles)
        cold = cold_cycles(root, args.cycles)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    median = {f"{kind}_{figure}": statistics.median(c[figure] for c in cycles)
              for kind, cycles in (("warm", warm), ("cold", cold))
              for figure in ("pause_s", "resume_s")}
    print(json.dumps({
        "bench": "warm_pause",
        "what": "resume command to the next step event: a warm pause (ranks idle in memory) "
                "against a cold one (checkpoint, exit, relaunch with --resume)",
        "spec": {"preset": "nano", "ranks": 2, "device": "cpu"},
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "cycles": {"warm": warm, "cold": cold},
        "warm_resume_s": median["warm_resume_s"],
        "target_s": TARGET_S,
        "met": median["warm_resume_s"] <= TARGET_S,
        "median_s": median,
        "ratios": {
            "cold_resume_vs_warm_resume": median["cold_resume_s"] / median["warm_resume_s"],
            "cold_pause_vs_warm_pause": median["cold_pause_s"] / median["warm_pause_s"],
        },
    }, indent=2))


if __name__ == "__main__":
    main()
