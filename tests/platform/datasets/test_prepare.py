"""The prepare task (datasets.tasks) through the session's real Celery worker and the engine's
prepare: registered → preparing (progress on the API) → ready with the manifest in the
platform's storage; a source that went missing fails with the engine's message; a failed
prepare is queued again."""

from __future__ import annotations

import json
import os

import psutil
import pytest
from django.conf import settings

from datasets.models import Dataset, DatasetState
from jobs.confinement import uploads_dir
from tests.platform.isolation.test_paths import upload

pytestmark = pytest.mark.django_db(transaction=True)


def corpus(documents: int) -> str:
    return "".join(json.dumps({"text": f"document {i}: " + "the quick brown fox " * 20}) + "\n"
                   for i in range(documents))


def not_prepared(dataset_id: int, worker) -> str:
    """What a wait for a prepare that did not end says: the row, and the worker's
    processes with their states (a prepare child stuck, or none started)."""
    processes = [(p.pid, p.cmdline()[-2:], p.status())
                 for p in psutil.Process(worker.pid).children(recursive=True)]
    return (f"not prepared: {list(Dataset.objects.filter(pk=dataset_id).values())}; "
            f"processes {processes}; worker log: {worker.log_path}")


def register(api, **fields) -> dict:
    answer = api.post("/api/datasets/", {"name": "web", "holdout": 0.05, "sources": [
        {"kind": "jsonl", "paths": ["*.jsonl"], "field": "text"}], **fields}, format="json")
    assert answer.status_code == 201, answer.json()
    return answer.json()


def test_a_dataset_is_prepared_on_a_worker_into_the_platforms_storage(
        api, celery_worker, eventually):
    upload(api, "web.jsonl", corpus(400))
    dataset = register(api)
    answer = api.post(f"/api/datasets/{dataset['id']}/prepare/")
    assert answer.status_code == 202 and answer.json()["state"] == DatasetState.PREPARING
    assert api.post(f"/api/datasets/{dataset['id']}/prepare/").status_code == 409
    eventually(lambda: Dataset.objects.get(pk=dataset["id"]).state != DatasetState.PREPARING,
               60, lambda: not_prepared(dataset["id"], celery_worker))
    ready = api.get(f"/api/datasets/{dataset['id']}/").json()
    assert ready["state"] == DatasetState.READY, ready["error"]
    splits = ready["manifest"]["splits"]
    assert splits["train"]["documents"] + splits["heldout"]["documents"] == 400
    assert splits["heldout"]["documents"] >= 1 and ready["vocab_size"] == 256
    assert ready["progress"]["documents"] == 400
    assert ready["progress"]["tokens"] == splits["train"]["tokens"] + splits["heldout"]["tokens"]
    folder = settings.RUNS_DIR / "datasets" / str(dataset["id"])
    assert json.loads((folder / "manifest.json").read_text())["splits"]["train"]["tokens"] == \
        splits["train"]["tokens"]


def test_a_prepare_that_cannot_read_its_source_fails_with_the_reason_and_is_queued_again(
        api, user, celery_worker, eventually):
    upload(api, "web.jsonl", corpus(50))
    dataset = register(api)
    os.unlink(uploads_dir(user) / "web.jsonl")
    api.post(f"/api/datasets/{dataset['id']}/prepare/")
    eventually(lambda: Dataset.objects.get(pk=dataset["id"]).state == DatasetState.FAILED,
               60, lambda: not_prepared(dataset["id"], celery_worker))
    failed = Dataset.objects.get(pk=dataset["id"])
    assert failed.error == "sources.0: no file under your data roots matches it"
    upload(api, "web.jsonl", corpus(50))
    assert api.post(f"/api/datasets/{dataset['id']}/prepare/").status_code == 202
    eventually(lambda: Dataset.objects.get(pk=dataset["id"]).state == DatasetState.READY,
               60, lambda: not_prepared(dataset["id"], celery_worker))
    assert Dataset.objects.get(pk=dataset["id"]).error == ""


def prepare_child() -> psutil.Process:
    """The running prepare's own process (engine.data.prepare_pipe), started by a pool process
    of the session's worker."""
    for proc in psutil.process_iter(["cmdline"]):
        if "engine.data.prepare_pipe" in (proc.info["cmdline"] or []):
            return proc
    raise AssertionError("no prepare is running")


def test_a_prepare_whose_worker_is_killed_mid_way_resumes_from_its_last_finished_shard(
        api, user, celery_worker, eventually):
    files, per_file = 120, 600  # 120 files of ~250 KB: 60 shards of the tests' 256 KiB
    documents = files * per_file
    folder = uploads_dir(user)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (folder / f"web-{i:03d}.jsonl").write_text(corpus(per_file))
    dataset = register(api)
    api.post(f"/api/datasets/{dataset['id']}/prepare/")
    shards = settings.RUNS_DIR / "datasets" / str(dataset["id"]) / "train"
    # watched on disk, not through the throttled progress: a shard takes tens of ms here
    eventually(lambda: len(list(shards.glob("*.idx"))) >= 2, 60,
               lambda: f"no shard finished; worker log: {celery_worker.log_path}",
               interval=0.01)
    prepare_child().parent().kill()  # the worker's pool process: the task is handed back
    eventually(lambda: Dataset.objects.get(pk=dataset["id"]).state != DatasetState.PREPARING,
               120, lambda: f"not prepared again; worker log: {celery_worker.log_path}")
    ready = Dataset.objects.get(pk=dataset["id"])
    assert ready.state == DatasetState.READY, ready.error
    assert ready.progress["bytes_resumed"] > 0  # the shards finished before the kill
    splits = ready.manifest["splits"]
    assert splits["train"]["documents"] + splits["heldout"]["documents"] == documents
    assert len(splits["train"]["shards"]) == ready.progress["shards_total"] == 60
