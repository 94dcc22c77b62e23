"""Storage the platform owns, against the real platform: bob's job trains on his upload and
checkpoints where the platform assigns; ada's attacks on those checkpoints (naming his folder
as hers, seeding from it, reading it as data, steering his job) are refused and leave every
byte of them as it was, nothing created outside the platform's storage; staff, who may read
his job, seed a run from his checkpoint by its ids, and the engine reads it."""

from __future__ import annotations

import json

import pytest
from django.conf import settings

from engine.runtime.confine import OUTSIDE
from jobs.confinement import CHECKPOINT_DIR, data_roots
from jobs.launch import checkpoint_folder, engine_spec
from jobs.models import Job, State
from monitor.models import Event
from tests.platform.isolation.conftest import checksums
from tests.platform.isolation.test_paths import errors_of, spec_with, upload

pytestmark = pytest.mark.django_db(transaction=True)


def finished(job_id: int) -> bool:
    return Job.objects.get(pk=job_id).state in (State.COMPLETED, State.FAILED)


def test_a_users_checkpoints_stay_theirs(api, bob_api, staff_api, other_user, celery_worker,
                                         eventually, tmp_path):
    corpus = upload(bob_api, "corpus.txt", "bob's corpus, his own words. " * 400)
    spec = spec_with({"kind": "text", "paths": ["corpus.txt"]},
                     checkpoint={"every": 2, "keep": 3})
    bobs = bob_api.post("/api/jobs/", spec, format="json").json()["id"]
    eventually(lambda: finished(bobs), 180, f"worker log: {celery_worker.log_path}")
    job = Job.objects.get(pk=bobs)
    assert job.state == State.COMPLETED, job.error
    folder = settings.RUNS_DIR / str(bobs) / "checkpoints"
    assert checkpoint_folder(job) == folder
    launched = json.loads((settings.RUNS_DIR / str(bobs) / "spec.json").read_text())
    assert launched["checkpoint"]["dir"] == str(folder)
    assert launched["data"]["roots"] == data_roots(other_user)
    assert launched["train"]["dataset"]["paths"] == [corpus["path"]]
    before = checksums(folder)
    assert before  # real checkpoints, written by the engine
    final = bob_api.get(f"/api/jobs/{bobs}/checkpoints/").json()["results"][-1]
    runs_before = {p.name for p in settings.RUNS_DIR.iterdir()}

    attacks = [
        (spec_with(checkpoint={"dir": str(folder)}), {"checkpoint.dir": CHECKPOINT_DIR}),
        (spec_with(checkpoint={"dir": str(tmp_path / "made")}), {"checkpoint.dir": CHECKPOINT_DIR}),
        (spec_with(model={"init_from": {"job": bobs, "checkpoint": final["id"]}}),
         {"model.init_from": f"job {bobs} has no checkpoint {final['id']}"}),
        (spec_with(model={"init_from": final["path"]}), {"model.init_from": OUTSIDE}),
        (spec_with({"kind": "text", "paths": [f"{final['path']}/*"]}),
         {"train.dataset.paths.0": OUTSIDE}),
    ]
    for attack, refusal in attacks:
        assert errors_of(api, attack) == refusal
    for verb, path, body in [
            ("post", "clone/", {"checkpoint": final["id"]}), ("post", "rollback/", {"step": 2}),
            ("post", f"checkpoints/{final['id']}/export/", {}), ("get", "checkpoints/", None)]:
        answer = getattr(api, verb)(f"/api/jobs/{bobs}/{path}", body, format="json")
        assert answer.status_code == 404, (path, answer.json())

    assert checksums(folder) == before
    assert not (tmp_path / "made").exists()
    assert {p.name for p in settings.RUNS_DIR.iterdir()} == runs_before

    seeded = staff_api.post("/api/jobs/", spec_with(
        model={"init_from": {"job": bobs, "checkpoint": final["id"]}}), format="json")
    assert seeded.status_code == 201, seeded.json()
    eventually(lambda: finished(seeded.json()["id"]), 180, f"worker log: "
               f"{celery_worker.log_path}")
    run = Job.objects.get(pk=seeded.json()["id"])
    assert run.state == State.COMPLETED, run.error
    logs = [e.data["message"] for e in Event.objects.filter(job=run, type="log")]
    assert f"initialised with the weights of checkpoint {final['path']}" in logs
    assert checksums(folder) == before


def test_the_operators_object_store_holds_checkpoints_by_job(user, settings):
    settings.STORAGE_URL = "s3://bucket/ringside"
    job = Job.objects.create(name="t", owner=user, spec=spec_with(checkpoint={"dir": "/x"}))
    assert checkpoint_folder(job) == f"s3://bucket/ringside/{job.pk}/checkpoints"
    assert engine_spec(job, job.spec)["checkpoint"]["dir"] == checkpoint_folder(job)
