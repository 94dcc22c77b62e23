"""engine.evaluate: a checkpoint's held-out loss per source and its task scores are what the
model computes directly; a run resumes where it stopped, and runs over disjoint item ranges
(slots) together score every item once, with the scores of one run; a task file outside the
data roots is refused."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.checkpoint.reader import resolve
from engine.evaluate import EvaluationError, evaluate, heldout_windows, scored_records
from engine.moe.model import MoEModel
from engine.runtime.spec import parse_spec
from tests.engine.test_export import engine_model

REPO = Path(__file__).resolve().parents[2]
TEXT = "the cat sat on the mat. the dog sat on the log. " * 40
TASKS = [
    {"prompt": "the cat sat on the", "continuation": " mat"},
    {"prompt": "the dog sat", "continuation": " on the log", "task": "dogs"},
    {"prompt": "the cat sat on the", "choices": [" mat", " xyz", " log"], "answer": 0},
    {"prompt": "the dog", "max_new_tokens": 4},
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, object, Path]:
    """A tiny model trained 2 steps on one rank: its checkpoint, spec and task file."""
    root = tmp_path_factory.mktemp("evaluate")
    (root / "data.txt").write_text(TEXT)
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    data = {
        "name": "evaluate-test", "model": {"preset": "tiny", "num_hidden_layers": 2},
        "parallel": {"nodes": 1, "procs_per_node": 1, "strategy": "NNN"},
        "train": {"steps": 2, "micro_batch": 2, "seq_len": 32, "warmup": 1, "eval_every": 0,
                  "device": "cpu", "threads": 1,
                  "dataset": {"kind": "text", "paths": [str(root / "data.txt")],
                              "tokenizer": "bytes", "holdout": 0.25}},
        "checkpoint": {"every": 0},
    }
    (root / "spec.json").write_text(json.dumps(data))
    run = subprocess.run([sys.executable, "-m", "engine.train", str(root / "spec.json"),
                          "--run-dir", str(root / "run")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return resolve(root / "run" / "checkpoints").path, parse_spec(data), root / "tasks.jsonl"


@pytest.fixture(scope="module")
def whole(trained, tmp_path_factory) -> tuple[dict, Path]:
    """One run over every item: its summary and folder."""
    checkpoint, spec, tasks = trained
    out = tmp_path_factory.mktemp("whole")
    return evaluate(str(checkpoint), out, spec, tasks=str(tasks), windows_per_source=3), out


def direct_loglik(model: MoEModel, prompt: str, continuation: str) -> tuple[float, bool]:
    context, target = list(prompt.encode()), list(continuation.encode())
    ids = torch.tensor([context + target])
    with torch.no_grad():
        logits = model(ids[:, :-1], ids[:, :-1], return_logits=True).logits[0]
    logp = F.log_softmax(logits, -1)[len(context) - 1:]
    wanted = torch.tensor(target)
    return logp.gather(1, wanted[:, None]).sum().item(), bool((logp.argmax(-1) == wanted).all())


def test_scores_equal_the_models_own_computation(trained, whole):
    checkpoint, spec, _ = trained
    summary, out = whole

    assert summary["complete"] and summary["items_total"] == 3 + len(TASKS)
    model = engine_model(checkpoint, spec.model)
    (loader,) = heldout_windows(spec)
    nll = tokens = 0.0
    with torch.no_grad():
        for _ in range(3):  # windows 0, 1, 2 in order
            batch = loader.next_micro_batch()
            nll += model(batch.input_ids, batch.labels).ce_loss.item() * batch.labels.numel()
            tokens += batch.labels.numel()
    heldout = summary["heldout"]["dataset"]
    assert heldout["tokens"] == tokens == 3 * 32
    assert heldout["loss"] == pytest.approx(nll / tokens, rel=1e-6)
    assert heldout["perplexity"] == pytest.approx(math.exp(nll / tokens), rel=1e-6)

    mat, mat_greedy = direct_loglik(model, TASKS[0]["prompt"], TASKS[0]["continuation"])
    assert summary["tasks"]["continuation"] == {
        "kind": "continuation", "items": 1, "exact_match": float(mat_greedy),
        "loglik": pytest.approx(mat, rel=1e-5)}
    logliks = [direct_loglik(model, TASKS[2]["prompt"], c)[0] for c in TASKS[2]["choices"]]
    best = max(range(3), key=logliks.__getitem__)
    assert summary["tasks"]["choice"] == {"kind": "choice", "items": 1,
                                          "accuracy": float(best == 0)}
    assert set(summary["tasks"]) == {"continuation", "dogs", "choice"}
    (generated,) = summary["generations"]
    assert generated["prompt"] == "the dog" and len(generated["text"].encode()) <= 4 * 4
    assert json.loads((out / "results.json").read_text()) == summary


def test_a_stopped_run_resumes_and_slots_score_every_item_once(trained, whole, tmp_path):
    checkpoint, spec, tasks = trained

    # slot 1 did items 0-1, slot 2 was stopped halfway through 2-6 (its last line cut short)
    slots = tmp_path / "slots"
    first = evaluate(str(checkpoint), slots, spec, tasks=str(tasks), items="0:2",
                     windows_per_source=3)
    assert (first["items_done"], first["complete"]) == (2, False)
    assert not (slots / "results.json").exists()
    evaluate(str(checkpoint), slots, spec, tasks=str(tasks), items="2:4", windows_per_source=3)
    with open(slots / "items-2-4.jsonl", "a") as log:
        log.write('{"index": 4, "kind": "cont')  # killed mid-write
    # one slot finishes the rest on its own
    rest = evaluate(str(checkpoint), slots, spec, tasks=str(tasks), windows_per_source=3)

    assert [r["index"] for r in map(json.loads, (slots / "items-0-7.jsonl").open())] == [4, 5, 6]
    assert sorted(scored_records(slots)) == list(range(7))
    assert rest == whole[0]


def test_a_task_file_outside_the_data_roots_is_refused(trained, tmp_path):
    checkpoint, spec, tasks = trained
    roots = [str(tasks.parent)]
    confined = dataclasses.replace(spec, data=dataclasses.replace(spec.data, roots=roots))
    (tmp_path / "secret.jsonl").write_text(json.dumps(TASKS[0]) + "\n")
    outside = tasks.parent / "link.jsonl"
    outside.symlink_to(tmp_path / "secret.jsonl")

    for path in (str(tmp_path / "secret.jsonl"), str(outside), "../../etc/passwd"):
        with pytest.raises(EvaluationError, match="^tasks: "):
            evaluate(str(checkpoint), tmp_path / "out", confined, tasks=path)
    assert not (tmp_path / "out").exists()


def test_a_bad_task_line_is_named(trained, tmp_path):
    checkpoint, spec, _ = trained
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(TASKS[0]) + "\n\n" + json.dumps({"prompt": "x", "choices": ["a"],
                                                                "answer": 3}) + "\n")
    with pytest.raises(EvaluationError, match=r'tasks line 3: "answer" must be the index'):
        evaluate(str(checkpoint), tmp_path / "out", spec, tasks=str(bad))
