"""A job's anomalies and the batches the fault policy's rerun found bad, as the job's API lists
them."""

import pytest

from engine.contract import AnomalyEvent, BadBatchEvent
from jobs.models import Job
from monitor.ingest import store_events

pytestmark = pytest.mark.django_db


def bad_batch(seq: int, step: int, samples: list[int]) -> dict:
    event = BadBatchEvent(step=step, anomaly="loss_spike", ranks=[1], samples=samples,
                          windows=[s * 7 for s in samples],
                          evidence={"loss": [3.0, 9.0], "rerun_loss": [3.0, 9.0]})
    event.job, event.seq, event.time = "1", seq, 1.0
    return event.to_dict()


def test_the_bad_batches_of_a_job_are_listed_oldest_first_and_only_to_its_owner(
        api, user, other_user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    assert api.get(f"/api/jobs/{job.pk}/bad-batches/").json() == {"bad_batches": []}
    store_events(job.pk, [bad_batch(5, 30, [118, 119]),
                          {"type": "log", "job": "1", "step": 31, "time": 1.0, "seq": 6,
                           "level": "info", "message": "not a bad batch"},
                          bad_batch(7, 44, [172, 173])])
    body = api.get(f"/api/jobs/{job.pk}/bad-batches/").json()
    assert [b["samples"] for b in body["bad_batches"]] == [[118, 119], [172, 173]]
    assert body["bad_batches"][0] == {
        "step": 30, "seq": 5, "anomaly": "loss_spike", "ranks": [1], "samples": [118, 119],
        "windows": [826, 833], "evidence": {"loss": [3.0, 9.0], "rerun_loss": [3.0, 9.0]}}
    theirs = Job.objects.create(name="x", owner=other_user, spec=small_spec)
    assert api.get(f"/api/jobs/{theirs.pk}/bad-batches/").status_code == 404


def anomaly(seq: int, step: int, kind: str, rank: int | None) -> dict:
    event = AnomalyEvent(step=step, kind=kind, severity="warn", rank=rank,
                         evidence={"value": 9.0})
    event.job, event.seq, event.time = "1", seq, 2.0
    return event.to_dict()


def test_the_anomalies_of_a_job_are_listed_oldest_first_a_page_at_a_time_and_only_to_its_owner(
        api, user, other_user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    store_events(job.pk, [anomaly(9, 40, "straggler", 1), anomaly(4, 20, "loss_spike", None)])
    page = api.get(f"/api/jobs/{job.pk}/anomalies/", {"limit": 1}).json()
    assert page["count"] == 2
    assert [{k: a[k] for k in ("seq", "step", "kind", "severity", "rank", "evidence")}
            for a in page["results"]] == [{"seq": 4, "step": 20, "kind": "loss_spike",
                                           "severity": "warn", "rank": None,
                                           "evidence": {"value": 9.0}}]
    rest = api.get(f"/api/jobs/{job.pk}/anomalies/", {"limit": 1, "offset": 1}).json()
    assert [a["kind"] for a in rest["results"]] == ["straggler"]
    theirs = Job.objects.create(name="x", owner=other_user, spec=small_spec)
    assert api.get(f"/api/jobs/{theirs.pk}/anomalies/").status_code == 404
