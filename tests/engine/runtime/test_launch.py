"""How the launcher ends a run whose configuration cannot work: at once, with the engine's
message naming the spec field, never through the restarts that a crash earns; and where a
relaunch resumes from."""

import shutil
from pathlib import Path

import pytest

from engine.checkpoint.replica import MARKER
from engine.contract import ExitCode, StateEvent, checkpoint_tiers, memory_dir
from engine.runtime.confine import SERVER_PATH
from engine.runtime.events import read_events
from engine.runtime.launch import RunTarget, launch, resume_sources
from engine.runtime.spec import parse_spec
from tests.policies import OBSERVE_STRAGGLERS


def one_by_two(name: str, **sections) -> dict:
    return {"name": name, "model": {"preset": "nano", **sections.pop("model", {})},
            "parallel": {"nodes": 1, "procs_per_node": 2},
            "train": {"steps": 4, "micro_batch": 2, "seq_len": 32, "eval_every": 0,
                      "threads": 1, **sections.pop("train", {})},
            "checkpoint": {"every": 0}, **sections}


def launched(tmp_path: Path, data: dict) -> tuple[int, list[dict]]:
    spec = parse_spec(data)
    target = RunTarget(run_dir=tmp_path / spec.name, events_path=tmp_path / "events.jsonl",
                       job=spec.name)
    return launch(spec, target), read_events(target.events_path)


@pytest.mark.parametrize("name, sections, field", [
    ("glob", {"train": {"dataset": {"kind": "text", "paths": ["/nonexistent/*.txt"]}}},
     "train.dataset.paths.0"),
    ("vocab", {"model": {"vocab_size": 100}}, "model.vocab_size"),
    ("tokenizer", {"train": {"dataset": {"tokenizer": "/nonexistent/tokenizer.json"}}},
     "train.dataset.tokenizer"),
])
def test_a_configuration_error_fails_the_job_at_once_naming_the_field(tmp_path, name, sections,
                                                                        field):
    code, events = launched(tmp_path, one_by_two(name, **sections))
    assert code == ExitCode.FAILED
    states = [e["state"] for e in events if e["type"] == "state"]
    assert states == ["starting", "failed"]
    assert events[-1]["error"].startswith(f"{field}: ")
    # no rank was restarted: no crash, no restart, not a step trained
    assert [e for e in events if e["type"] in ("anomaly", "action", "step")] == []


def spiked_at(step: int, name: str, **policy) -> dict:
    """A 1x2 run whose loss spikes at `step`, answered by a restart of the healthy ranks."""
    return one_by_two(name, train={"steps": 12}, faults={
        "inject": [{"kind": "loss_spike", "step": step, "rank": 1, "factor": 10.0}],
        "policy": {**OBSERVE_STRAGGLERS["policy"],
                   "actions": {**OBSERVE_STRAGGLERS["policy"]["actions"],
                               "loss_spike": ["restart"]}, **policy}})


def test_a_policy_restart_snapshots_first_and_resumes_at_the_step_it_stopped(tmp_path):
    code, events = launched(tmp_path, spiked_at(8, "restart"))
    assert code == ExitCode.COMPLETED
    (restart,) = [e for e in events if e["type"] == "action"]
    assert (restart["action"], restart["anomaly"], restart["step"]) == ("restart", "loss_spike", 8)
    # the snapshot of step 7, the last one completed, in the memory tier
    assert restart["checkpoint"].startswith(str(memory_dir(tmp_path / "restart" / "checkpoints")))
    assert restart["checkpoint"].endswith("step-000007")
    # not a crash: nothing says one happened, and no crash restart was spent
    assert [e["kind"] for e in events if e["type"] == "anomaly"] == ["loss_spike"]
    (resumed,) = [e for e in events if e["type"] == "log" and e["message"].startswith("resumed")]
    assert resumed["step"] == 7
    # 0 steps lost: every step stored exactly once, the resumed run's first step 8
    steps = [e["step"] for e in events if e["type"] == "step"]
    assert steps == list(range(1, 13))


def test_when_the_policys_restarts_run_out_the_job_pauses_with_the_reason(tmp_path):
    code, events = launched(tmp_path, spiked_at(8, "out", policy_restarts=0))
    assert code == ExitCode.PAUSED
    final = events[-1]
    assert (final["state"], final["mode"], final["step"]) == ("paused", "cold", 7)
    assert final["reason"] == "loss_spike: restart capped: 0 for loss_spike within 3600 s"
    (pause,) = [e for e in events if e["type"] == "action"]
    assert pause["action"] == "pause" and Path(pause["checkpoint"]).is_dir()


def test_a_platform_runs_failure_shows_no_path_outside_its_visible_folders(tmp_path):
    run = tmp_path / "run"
    target = RunTarget(run_dir=run, events_path=tmp_path / "events.jsonl", job="j",
                       visible=(str(run), str(tmp_path / "data")))
    target.emit(StateEvent(step=0, state="failed",
                           error=f"launcher: /usr/lib/python3/x.py broke on {run}/spec.json",
                           traceback='File "/srv/ringside/engine/runtime/launch.py", line 1'))
    failed = read_events(target.events_path)[-1]
    assert failed["error"] == f"launcher: {SERVER_PATH} broke on {run}/spec.json"
    assert failed["traceback"] == f'File "{SERVER_PATH}", line 1'


def test_a_relaunch_from_its_own_folder_looks_in_the_memory_tier_only_if_hosts_replicated_it(
        tmp_path):
    spec = parse_spec({"name": "relaunched", "model": {"preset": "tiny"}})
    own = tmp_path / "checkpoints"
    target = RunTarget(run_dir=tmp_path, events_path=tmp_path / "e.jsonl", job="j",
                       resume_from=own)
    memory = memory_dir(own)
    try:
        assert resume_sources(spec, target, restarted=False) == [own]  # one host: as before
        memory.mkdir(parents=True)
        (memory / MARKER).touch()  # a ring of hosts held its snapshots
        assert resume_sources(spec, target, restarted=False) == checkpoint_tiers(own)
        other = RunTarget(run_dir=tmp_path, events_path=tmp_path / "e.jsonl", job="j",
                          resume_from=tmp_path / "another-run")
        assert resume_sources(spec, other, restarted=False) == [tmp_path / "another-run"]
    finally:
        shutil.rmtree(memory, ignore_errors=True)
