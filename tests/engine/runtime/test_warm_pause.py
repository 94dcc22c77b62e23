"""A warm pause: the ranks idle at a step boundary with their state in memory and a resume
goes on training in the same processes; past its limit the pause turns cold.

The real CLI (elastic launcher, two gloo ranks) steered through its run folder's control file.
"""

import time

import psutil

from engine.contract import ExitCode
from tests.engine.runtime.test_control import Run, losses_by_step, nano


def ranks_of(run: Run) -> set[int]:
    """The PIDs of the launcher's processes: the ranks (and what multiprocessing adds)."""
    return {p.pid for p in psutil.Process(run.proc.pid).children(recursive=True)}


def test_warm_pause_then_resume_keeps_the_ranks_and_the_loss_curve(tmp_path):
    spec = nano("warm", steps=30, every=1000)  # no scheduled checkpoint before the last step
    straight = Run(tmp_path, {**spec, "name": "straight"})
    assert straight.finish() == 0

    run = Run(tmp_path, spec)
    run.wait_for(lambda e: e["type"] == "step" and e["step"] >= 3)
    ranks = ranks_of(run)
    run.command("pause", mode="warm", max_s=120)
    paused = run.wait_for(lambda e: e["type"] == "state" and e["state"] == "paused")
    time.sleep(2)  # the ranks idle
    run.command("resume")
    running = run.wait_for(lambda e: e["type"] == "state" and e.get("mode") == "warm"
                           and e["state"] == "running")
    assert ranks_of(run) == ranks and len(ranks) >= 2  # the same processes go on
    assert run.finish() == 0

    events = run.events()
    pause, resume = (e for e in events if e["type"] == "action" and e["by"] == "command")
    assert (pause["action"], pause["mode"], pause["max_s"]) == ("pause", "warm", 120)
    assert (resume["action"], resume["command"]) == ("resume", "test-resume")
    assert paused["mode"] == "warm" and paused["step"] == running["step"] == pause["step"]
    while_paused = [e for e in events if pause["seq"] < e["seq"] < running["seq"]]
    assert [e["type"] for e in while_paused] == ["state", "action"]  # no step, no checkpoint
    assert not any(e["type"] == "anomaly" and e["kind"] == "hang" for e in events)
    steps = [e["step"] for e in events if e["type"] == "step"]
    assert steps == list(range(1, 31))
    # the same processes, the same state: bitwise the same losses
    assert losses_by_step(events) == losses_by_step(straight.events())


def test_a_warm_pause_past_its_limit_checkpoints_and_stops(tmp_path):
    run = Run(tmp_path, nano("cooled", steps=200, every=1000))
    run.wait_for(lambda e: e["type"] == "step" and e["step"] >= 3)
    run.command("pause", mode="warm", max_s=1)
    assert run.finish() == ExitCode.PAUSED

    events = run.events()
    pause = next(e for e in events if e["type"] == "action")
    checkpoint = next(e for e in events if e["type"] == "checkpoint")
    assert checkpoint["step"] == pause["step"] and checkpoint["tier"] == "disk"
    assert (run.run_dir / "checkpoints" / f"step-{pause['step']:06d}" / "MANIFEST.json").exists()
    assert events[-1]["type"] == "state"
    assert (events[-1]["state"], events[-1]["mode"]) == ("paused", "cold")
    assert events[-1]["reason"] == "warm pause exceeded 1 s: checkpointed and stopped"
