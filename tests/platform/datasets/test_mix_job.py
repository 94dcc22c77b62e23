"""Register → prepare → train: two datasets prepared on the real worker, then a 2-rank job on
their mixture that completes, its engine reading the prepared folders under confinement."""

from __future__ import annotations

import copy
import json

import pytest

from datasets.models import Dataset, DatasetState
from jobs.models import Job, State
from tests.platform.datasets.test_prepare import not_prepared
from tests.platform.isolation.test_paths import upload
from tests.platform.services import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


def prepared(api, name: str, text: str, eventually, worker) -> int:
    upload(api, f"{name}.jsonl", "".join(json.dumps({"text": f"{text} {i}. " * 12}) + "\n"
                                         for i in range(200)))
    answer = api.post("/api/datasets/", {"name": name, "sources": [
        {"kind": "jsonl", "paths": [f"{name}.jsonl"]}]}, format="json")
    dataset_id = answer.json()["id"]
    api.post(f"/api/datasets/{dataset_id}/prepare/")
    eventually(lambda: Dataset.objects.get(pk=dataset_id).state == DatasetState.READY, 60,
               lambda: not_prepared(dataset_id, worker))
    return dataset_id


def test_a_two_rank_job_trains_on_a_mixture_of_two_prepared_datasets(api, celery_worker,
                                                                     eventually):
    prepared(api, "web", "the web says hello", eventually, celery_worker)
    code = prepared(api, "code", "def f(x): return x", eventually, celery_worker)
    spec = copy.deepcopy(SMALL_SPEC)
    spec["parallel"] = {"nodes": 1, "procs_per_node": 2}
    spec["train"].update(steps=4, data={"mix": [{"dataset": "web", "weight": 3},
                                                {"dataset": code, "weight": 1}]})
    answer = api.post("/api/jobs/", spec, format="json")
    assert answer.status_code == 201, answer.json()
    job_id = answer.json()["id"]
    eventually(lambda: Job.objects.get(pk=job_id).state in (State.COMPLETED, State.FAILED), 180,
               lambda: f"job {job_id} did not finish; worker log: {celery_worker.log_path}")
    job = Job.objects.get(pk=job_id)
    assert job.state == State.COMPLETED, job.error
    assert job.step == 4
