"""Evaluating a checkpoint through the API: the real Celery worker runs `engine.evaluate` on
the job's checkpoint with the user's task file, and GET lists the evaluation with its results;
another user's checkpoint is not found, and a task file outside the user's data roots is
refused before anything is queued."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.checkpoint.reader import resolve
from engine.evaluate import evaluate
from engine.runtime.spec import parse_spec
from jobs import evaluations
from jobs.confinement import uploads_dir
from jobs.models import Checkpoint, Evaluation, Job, State

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = [{"prompt": "the cat sat on the", "continuation": " mat"},
         {"prompt": "a b c", "choices": [" d", " q"], "answer": 0, "task": "letters"},
         {"prompt": "once", "max_new_tokens": 3}]


def evaluate_url(job_id: int, checkpoint_id: int) -> str:
    return f"/api/jobs/{job_id}/checkpoints/{checkpoint_id}/evaluate/"


def test_a_checkpoint_is_evaluated_on_the_users_tasks(api, user, celery_worker,
                                                      tmp_path_factory, eventually):
    job, checkpoint = shared_trained_checkpoint(user, tmp_path_factory)
    final = api.get(f"/api/jobs/{job.pk}/checkpoints/").json()["results"][-1]
    assert final["id"] == checkpoint.pk
    assert api.get(evaluate_url(job.pk, final["id"])).json()["results"] == []
    (uploads_dir(user) / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))

    started = api.post(evaluate_url(job.pk, final["id"]),
                       {"tasks": "tasks.jsonl", "heldout_windows": 2}, format="json")
    assert started.status_code == 202, started.json()
    assert started.json()["state"] == "pending"
    assert started.json()["tasks"] == str((uploads_dir(user) / "tasks.jsonl").resolve())

    def finished() -> dict | None:
        listed = api.get(evaluate_url(job.pk, final["id"])).json()["results"]
        return listed[0] if listed[0]["state"] in ("done", "failed") else None

    eventually(finished, 180, f"the evaluation did not finish; worker log: "
                              f"{celery_worker.log_path}")
    evaluation = finished()
    assert evaluation["state"] == "done", evaluation["error"]
    assert (evaluation["step"], evaluation["items_done"], evaluation["items_total"]) == (
        checkpoint.step, 5, 5)
    results = evaluation["results"]
    (heldout,) = results["heldout"].values()
    assert heldout["windows"] == 2 and heldout["perplexity"] > 1
    assert set(results["tasks"]) == {"continuation", "letters"}
    assert results["tasks"]["letters"]["accuracy"] in (0.0, 1.0)
    assert [g["prompt"] for g in results["generations"]] == ["once"]


def test_another_users_checkpoint_is_not_found(api, other_user, small_spec, tmp_path):
    theirs = Job.objects.create(name="theirs", owner=other_user, spec=small_spec)
    checkpoint = Checkpoint.objects.create(job=theirs, seq=1, step=2, time=0.0, tier="disk",
                                           path=str(tmp_path))

    assert api.post(evaluate_url(theirs.pk, checkpoint.pk)).status_code == 404
    assert api.get(evaluate_url(theirs.pk, checkpoint.pk)).status_code == 404
    assert not Evaluation.objects.exists()


def test_a_task_file_outside_the_users_data_roots_is_refused(api, user, other_user,
                                                             small_spec, tmp_path):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    checkpoint = Checkpoint.objects.create(job=job, seq=1, step=2, time=0.0, tier="disk",
                                           path=str(tmp_path))
    theirs = uploads_dir(other_user) / "tasks.jsonl"
    theirs.parent.mkdir(parents=True, exist_ok=True)
    theirs.write_text(json.dumps(TASKS[0]) + "\n")
    uploads_dir(user).mkdir(parents=True, exist_ok=True)
    (uploads_dir(user) / "link.jsonl").symlink_to(theirs)

    for attack in (str(theirs), f"../{other_user.pk}/tasks.jsonl", "link.jsonl", "/etc/passwd"):
        refused = api.post(evaluate_url(job.pk, checkpoint.pk), {"tasks": attack},
                           format="json")
        assert refused.status_code == 400, attack
        assert list(refused.json()) == ["tasks"]
    assert not Evaluation.objects.exists()


def evaluable_spec(user) -> dict:
    """The spec of a nano model trained 2 steps on a text it writes in `user`'s uploads."""
    uploads_dir(user).mkdir(parents=True, exist_ok=True)
    data = uploads_dir(user) / "text.txt"
    data.write_text("the cat sat on the mat. the dog sat on the log. " * 40)
    return {"name": "evaluate", "model": {"preset": "nano"},
            "train": {"steps": 2, "micro_batch": 2, "seq_len": 32, "eval_every": 0,
                      "threads": 1, "dataset": {"kind": "text", "paths": [str(data)],
                                                "tokenizer": "bytes", "holdout": 0.25}},
            "checkpoint": {"every": 0}}


def recorded(user, spec: dict, path: str) -> tuple[Job, Checkpoint]:
    """The checkpoint folder `path` of `spec`, recorded as a finished job's disk checkpoint."""
    job = Job.objects.create(name="t", owner=user, spec=spec, state=State.COMPLETED)
    return job, Checkpoint.objects.create(job=job, seq=1, step=spec["train"]["steps"], time=0.0,
                                          tier="disk", path=path)


def trained_checkpoint(user, tmp_path) -> tuple[Job, Checkpoint]:
    """A nano model trained 2 steps by the engine's own command line on a file in `user`'s
    uploads, recorded as a finished job's disk checkpoint."""
    spec = evaluable_spec(user)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    run = subprocess.run([sys.executable, "-m", "engine.train", str(tmp_path / "spec.json"),
                          "--run-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return recorded(user, spec, str(resolve(tmp_path / "run" / "checkpoints").path))


# the folder of the checkpoint trained once by this test process: the tests that only read it
# share it (an evaluation only reads it), each with its own rows and its user's text
_TRAINED: list[str] = []


def shared_trained_checkpoint(user, tmp_path_factory) -> tuple[Job, Checkpoint]:
    """`trained_checkpoint`, trained once per test process and recorded for each test."""
    if not _TRAINED:
        job, checkpoint = trained_checkpoint(user, tmp_path_factory.mktemp("trained"))
        _TRAINED.append(checkpoint.path)
        return job, checkpoint
    return recorded(user, evaluable_spec(user), _TRAINED[0])


def test_a_two_slot_evaluation_yielding_a_slot_to_training_scores_each_item_once(
        user, tmp_path, tmp_path_factory, monkeypatch):
    monkeypatch.setattr(evaluations, "CHUNK_ITEMS", 3)
    job, checkpoint = shared_trained_checkpoint(user, tmp_path_factory)
    (uploads_dir(user) / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    tasks = str((uploads_dir(user) / "tasks.jsonl").resolve())
    out_dir = tmp_path / "evaluation"
    out_dir.mkdir()
    # run here, not queued (the session's worker would run it too)
    evaluation = Evaluation.objects.create(checkpoint=checkpoint, tasks=tasks, heldout_windows=6,
                                           slots=2, out_dir=str(out_dir))
    launched, launch = [], evaluations._launch

    def launch_and_note(engine: list[str], items: range, out: Path):
        launched.append(items)
        return launch(engine, items, out)

    monkeypatch.setattr(evaluations, "_launch", launch_and_note)

    def free() -> int:
        """2 slots until the first item is scored (both slots at work: a chunk is 3 items);
        then a training job takes one."""
        return 2 if not any(p.stat().st_size for p in out_dir.glob("items-*.jsonl")) else 1

    results = evaluations.run_slots(evaluation, free)

    assert (results["complete"], results["items_total"]) == (True, 6 + len(TASKS))
    # the second slot was stopped mid-chunk, and its chunk run again on the slot left
    assert launched[:2] == [range(0, 3), range(3, 6)] and launched.count(range(3, 6)) == 2
    indices = [json.loads(line)["index"] for p in out_dir.glob("items-*.jsonl")
               for line in p.read_text().splitlines() if line.endswith("}")]
    assert sorted(indices) == list(range(6 + len(TASKS)))  # each item scored exactly once
    one_slot = evaluate(checkpoint.path, tmp_path / "one-slot", parse_spec(
        json.loads((out_dir / "spec.json").read_text())), tasks=tasks, windows_per_source=6)
    assert results == one_slot
