"""The prepare task (datasets.tasks) through the session's real Celery worker and the engine's
prepare: registered → preparing (progress on the API) → ready with the manifest in the
platform's storage; a source that went missing fails with the engine's message; a failed
prepare is queued again."""

from __future__ import annotations

import json
import os

import pytest
from django.conf import settings

from datasets.models import Dataset, DatasetState
from jobs.confinement import uploads_dir
from tests.platform.isolation.test_paths import upload

pytestmark = pytest.mark.django_db(transaction=True)


def corpus(documents: int) -> str:
    return "".join(json.dumps({"text": f"document {i}: " + "the quick brown fox " * 20}) + "\n"
                   for i in range(documents))


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
               60, lambda: f"not prepared; worker log: {celery_worker.log_path}")
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
               60, lambda: f"did not fail; worker log: {celery_worker.log_path}")
    failed = Dataset.objects.get(pk=dataset["id"])
    assert failed.error == "sources.0: no file under your data roots matches it"
    upload(api, "web.jsonl", corpus(50))
    assert api.post(f"/api/datasets/{dataset['id']}/prepare/").status_code == 202
    eventually(lambda: Dataset.objects.get(pk=dataset["id"]).state == DatasetState.READY,
               60, lambda: f"not prepared; worker log: {celery_worker.log_path}")
    assert Dataset.objects.get(pk=dataset["id"]).error == ""
