"""How the launcher ends a run whose configuration cannot work: at once, with the engine's
message naming the spec field, never through the restarts that a crash earns."""

from pathlib import Path

import pytest

from engine.contract import ExitCode
from engine.runtime.events import read_events
from engine.runtime.launch import RunTarget, launch
from engine.runtime.spec import parse_spec


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
