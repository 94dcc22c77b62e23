"""The tiny model learns the default corpus with balanced experts, and a clean run raises no
alarm. Slow (300 steps of 8x256 tokens): run by `make bench`, not by `make test`."""

import pytest

from engine.runtime.events import read_events
from engine.runtime.launch import RunTarget, launch
from engine.runtime.spec import parse_spec


@pytest.mark.bench
def test_tiny_reaches_the_quality_bar_in_300_steps_without_a_false_alarm(tmp_path):
    spec = parse_spec({
        "name": "quality", "model": {"preset": "tiny"},
        "train": {"steps": 300, "micro_batch": 8, "seq_len": 256, "eval_every": 100,
                  "eval_batches": 8},
        "checkpoint": {"every": 100},
    })
    target = RunTarget(run_dir=tmp_path / "run", events_path=tmp_path / "events.jsonl",
                       job=spec.name)
    assert launch(spec, target) == 0
    events = read_events(target.events_path)

    last = [e for e in events if e["type"] == "step"][-1]
    assert last["step"] == 300 and last["eval_loss"] <= 2.3  # nats per byte, held out
    layers = [e for e in events if e["type"] == "experts"][-1]["layers"]
    mean_violation = sum(layer["max_violation"] for layer in layers) / len(layers)
    dead = sum(layer["dead_experts"] for layer in layers)
    experts = sum(len(layer["tokens_per_expert"]) for layer in layers)
    assert mean_violation <= 3.0
    assert dead <= 0.05 * experts
    assert [e for e in events if e["type"] == "anomaly"] == []
