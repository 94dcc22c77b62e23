"""Training end to end through the real launcher: loss falls, ranks agree, the CLI reports."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.runtime.events import read_events
from engine.runtime.launch import RunTarget, launch
from engine.runtime.schedule import lr_at
from engine.runtime.spec import parse_spec

REPO = Path(__file__).resolve().parents[3]


def tiny_spec(name: str, steps: int, ranks: int, micro_batch: int, **train) -> dict:
    return {
        "name": name,
        "model": {"preset": "tiny"},
        "parallel": {"nodes": 1, "procs_per_node": ranks},
        "train": {"steps": steps, "micro_batch": micro_batch, "seq_len": 64, "lr": 2e-3,
                  "warmup": 10, "eval_every": 0, "threads": 1, **train},
        "checkpoint": {"every": 0},
    }


def run(tmp_path: Path, data: dict) -> list[dict]:
    spec = parse_spec(data)
    target = RunTarget(run_dir=tmp_path / spec.name, events_path=tmp_path / f"{spec.name}.jsonl",
                       job=spec.name)
    assert launch(spec, target) == 0
    return read_events(target.events_path)


def losses(events: list[dict]) -> list[float]:
    return [e["loss"] for e in events if e["type"] == "step"]


def test_the_learning_rate_warms_up_then_decays():
    train = parse_spec({"name": "x", "train": {"steps": 100, "warmup": 10, "lr": 1.0}}).train
    assert lr_at(1, train) == pytest.approx(0.1)
    assert lr_at(10, train) == pytest.approx(1.0)
    assert lr_at(100, train) == pytest.approx(train.min_lr_ratio)
    assert all(lr_at(s, train) >= lr_at(s + 1, train) for s in range(10, 100))


def test_tiny_loss_falls_on_one_and_two_ranks_and_the_ranks_agree(tmp_path):
    # after 30 steps (10 of warmup) the last ten average 0.65 of the first five (CPU: the same
    # every run), under the 0.75 bar
    one = run(tmp_path, tiny_spec("one", steps=30, ranks=1, micro_batch=4))
    two = run(tmp_path, tiny_spec("two", steps=30, ranks=2, micro_batch=2))

    for events in (one, two):
        curve = losses(events)
        assert len(curve) == 30
        assert sum(curve[-10:]) / 10 < 0.75 * sum(curve[:5]) / 5
        states = [e["state"] for e in events if e["type"] == "state"]
        assert states == ["starting", "running", "completed"]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        step = next(e for e in events if e["type"] == "step")
        assert {"loss", "grad_norm", "lr", "tokens_per_s", "step_time", "memory"} <= step.keys()
        experts = next(e for e in events if e["type"] == "experts")
        assert len(experts["layers"]) == 6  # tiny: 5 MoE layers (the first is dense) + MTP

    # the same global batch split over two ranks gives the same first losses
    assert losses(two)[:5] == pytest.approx(losses(one)[:5], rel=1e-4)


def write_spec(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data))
    return path


def cli(*args: str, console: Path, **kwargs) -> subprocess.Popen:
    """The CLI with its console in a file (a pipe nobody reads would fill up and block)."""
    with console.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "engine.train", *args], cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, **kwargs)


def test_the_cli_refuses_a_bad_spec_naming_the_fields(tmp_path):
    path = write_spec(tmp_path, {"name": "bad", "train": {"steps": -1, "speed": 3}})
    proc = cli(str(path), console=tmp_path / "console.log")
    proc.wait(timeout=60)
    err = (tmp_path / "console.log").read_text()
    assert proc.returncode == 2
    assert "train.steps: must be at least 1" in err
    assert "train.speed: unknown field" in err


def test_sigterm_cancels_the_run_and_stops_every_rank(tmp_path):
    # stopping does not depend on the model: nano, whose ranks reach their first step sooner
    data = {**tiny_spec("cancel", steps=10_000, ranks=2, micro_batch=2),
            "model": {"preset": "nano"}}
    events_path = tmp_path / "events.jsonl"
    proc = cli(str(write_spec(tmp_path, data)), "--events", str(events_path),
               "--run-dir", str(tmp_path / "run"), console=tmp_path / "console.log",
               start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if events_path.exists() and any(e["type"] == "step" for e in read_events(events_path)):
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the run never reached its first step")

    stopped_at = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    assert time.monotonic() - stopped_at < 10
    assert proc.returncode == 128 + signal.SIGTERM
    states = [e["state"] for e in read_events(events_path) if e["type"] == "state"]
    assert states[-1] == "cancelled"
    # a rank may still be tearing down for a moment after the launcher returned
    deadline = time.monotonic() + 5
    while live_processes_in_session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_processes_in_session(proc.pid) == []
    assert time.monotonic() - stopped_at < 10


def live_processes_in_session(sid: int) -> list[str]:
    """Processes of the session that still run (an exited, unreaped zombie does not count)."""
    ps = subprocess.run(["ps", "-e", "-o", "sid=,stat=,pid=,args="], capture_output=True,
                        text=True, check=True)
    rows = [line.split(None, 3) for line in ps.stdout.splitlines()]
    return [" ".join(r) for r in rows if r[0] == str(sid) and not r[1].startswith("Z")]
