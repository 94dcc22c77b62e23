"""Exporting a checkpoint through the API: the real Celery worker runs `engine.export` into the
job's run folder, the record says how it went, and what cannot be exported is refused with the
reason."""


import pytest
from django.conf import settings

from jobs.models import Checkpoint, Job, State
from tests.platform.services import stored_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


def export_url(job_id: int, checkpoint_id: int) -> str:
    return f"/api/jobs/{job_id}/checkpoints/{checkpoint_id}/export/"


def test_a_finished_jobs_checkpoint_exports_to_a_model_folder(api, celery_worker, small_spec,
                                                              eventually):
    job_id = api.post("/api/jobs/", small_spec, format="json").json()["id"]
    eventually(lambda: Job.objects.get(pk=job_id).state == State.COMPLETED, 120,
               f"job {job_id} did not complete; worker log: {celery_worker.log_path}")
    final = api.get(f"/api/jobs/{job_id}/checkpoints/").json()["results"][-1]
    assert (final["step"], final["tier"], final["export"]) == (6, "disk", None)
    assert api.get(export_url(job_id, final["id"])).status_code == 404  # not exported yet

    started = api.post(export_url(job_id, final["id"]))
    assert started.status_code == 202, started.json()
    out_dir = settings.RUNS_DIR / str(job_id) / "exports" / "step-000006"
    assert (started.json()["state"], started.json()["out_dir"]) == ("pending", str(out_dir))

    def done() -> bool:
        return api.get(export_url(job_id, final["id"])).json()["state"] in ("done", "failed")

    eventually(done, 180, f"the export did not finish; worker log: {celery_worker.log_path}")
    export = api.get(export_url(job_id, final["id"])).json()
    assert export["state"] == "done", export["error"]
    assert (out_dir / "config.json").exists() and (out_dir / "model.safetensors").exists()
    assert export["summary"]["step"] == 6 and export["summary"]["out_dir"] == str(out_dir)
    listed = api.get(f"/api/jobs/{job_id}/checkpoints/").json()["results"][-1]
    assert listed["export"]["state"] == "done"


def test_what_cannot_be_exported_is_refused_with_the_reason(api, user, small_spec, tmp_path):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    memory = Checkpoint.objects.create(job=job, seq=1, step=2, time=0.0, tier="memory",
                                       path=str(tmp_path))
    deleted = Checkpoint.objects.create(job=job, seq=2, step=4, time=0.0, tier="disk",
                                        path=str(tmp_path / "step-000004"))

    missing = api.post(export_url(job.pk, deleted.pk + 100))
    assert missing.status_code == 404
    assert missing.json()["detail"] == f"job {job.pk} has no checkpoint {deleted.pk + 100}"
    in_memory = api.post(export_url(job.pk, memory.pk))
    assert in_memory.status_code == 409 and "memory-tier" in in_memory.json()["detail"]
    gone = api.post(export_url(job.pk, deleted.pk))
    assert gone.status_code == 409 and "deleted by the job's retention" in gone.json()["detail"]


def test_an_export_the_engine_refuses_is_recorded_as_failed_with_its_message(
        api, celery_worker, user, small_spec, tmp_path, eventually):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    # a manifest that describes no checkpoint
    bad = Checkpoint.objects.create(job=job, seq=1, step=2, time=0.0, tier="disk",
                                    path=stored_checkpoint(tmp_path / "step-000002"))
    assert api.post(export_url(job.pk, bad.pk)).status_code == 202

    eventually(lambda: api.get(export_url(job.pk, bad.pk)).json()["state"] == "failed", 120,
               f"the export did not fail; worker log: {celery_worker.log_path}")
    assert api.get(export_url(job.pk, bad.pk)).json()["error"].startswith("export: ")
