"""jobs.admission, through the API: a user at their jobs quota gets 429 naming it; a priority
over the cap for a user who is not staff, and a model no registered host holds in any
strategy, get 400 naming the fields; a big-enough host admits it, and so does a server with no
host at all. The planner's answer carries the same refusal, which the launch form shows."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from hosts.models import Host
from jobs.models import ApiToken, Job, Quota, State

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("session_worker_host_hidden")]

GB = 10**9
# 16.4 B parameters: its smallest state on one rank is far over any one device's memory
BIG = {"name": "big", "model": {"preset": "ling-mini-2.0"}, "train": {"steps": 2}}


def host(name: str, cpu_bytes: int = 64 * GB, gpus: list[int] = ()) -> Host:
    return Host.objects.create(
        name=name, address="10.0.0.1", slots=max(len(gpus), 8), instance="x",
        beat_at=timezone.now(),
        devices={"cpu": {"cores": 8, "memory_bytes": cpu_bytes},
                 "gpus": [{"name": "NVIDIA H100", "memory_bytes": m} for m in gpus]})


def test_a_user_at_their_jobs_quota_gets_429_naming_it(api, user, small_spec):
    Quota.objects.create(user=user, jobs=2)
    for _ in range(2):
        assert api.post("/api/jobs/", small_spec, format="json").status_code == 201
    refused = api.post("/api/jobs/", small_spec, format="json")
    assert refused.status_code == 429
    assert "jobs quota is 2" in refused.json()["detail"]
    assert Job.objects.filter(owner=user).count() == 2
    # a paused or finished job does not count; clone is admitted the same way
    Job.objects.filter(owner=user).update(state=State.COMPLETED)
    first = Job.objects.filter(owner=user).first()
    assert api.post(f"/api/jobs/{first.pk}/clone/", {}, format="json").status_code == 201
    assert api.post(f"/api/jobs/{first.pk}/clone/", {}, format="json").status_code == 201
    assert api.post(f"/api/jobs/{first.pk}/clone/", {}, format="json").status_code == 429


def test_the_settings_default_applies_without_a_quota_row(api, user, small_spec, settings):
    settings.RINGSIDE_QUOTA_JOBS = 1
    assert api.post("/api/jobs/", small_spec, format="json").status_code == 201
    assert api.post("/api/jobs/", small_spec, format="json").status_code == 429
    Quota.objects.create(user=user, jobs=0)  # 0: no limit for this user
    assert api.post("/api/jobs/", small_spec, format="json").status_code == 201


def test_a_priority_over_the_cap_is_400_unless_staff(api, user, small_spec, settings):
    settings.RINGSIDE_MAX_USER_PRIORITY = 5
    refused = api.post("/api/jobs/", {**small_spec, "priority": 6}, format="json")
    assert refused.status_code == 400
    assert "at most 5" in refused.json()["errors"]["priority"]
    assert api.post("/api/jobs/", {**small_spec, "priority": 5}, format="json").status_code == 201
    user.is_staff = True
    user.save()
    made = api.post("/api/jobs/", {**small_spec, "priority": 90}, format="json")
    assert made.status_code == 201 and made.json()["priority"] == 90


def test_a_clone_by_a_user_takes_the_capped_priority(api, user, small_spec):
    original = Job.objects.create(name="t", owner=user, spec=small_spec, priority=50,
                                  state=State.COMPLETED)
    clone = api.post(f"/api/jobs/{original.pk}/clone/", {}, format="json")
    assert clone.status_code == 201 and clone.json()["priority"] == 0


def test_a_model_no_host_holds_is_400_naming_the_model_fields(api, user):
    host("small-cpu", cpu_bytes=32 * GB)
    host("one-gpu", gpus=[80 * GB])
    refused = api.post("/api/jobs/", {**BIG, "model": {"preset": "ling-mini-2.0",
                                                       "num_hidden_layers": 24}},
                       format="json")
    assert refused.status_code == 400
    errors = refused.json()["errors"]
    assert set(errors) == {"model.preset", "model.num_hidden_layers"}
    message = errors["model.preset"]
    assert "GB on a device in its smallest strategy" in message
    assert "the largest device of a registered host holds 80.0 GB (one-gpu: NVIDIA H100)" in message
    assert not Job.objects.filter(owner=user).exists()


def test_a_model_that_fits_a_host_in_some_strategy_is_admitted(api):
    host("small-cpu", cpu_bytes=32 * GB)
    # 8 ranks on 8 GPUs: the fully sharded strategy puts 1/8 of the state on each
    host("eight-gpus", gpus=[80 * GB] * 8)
    spec = {**BIG, "parallel": {"procs_per_node": 8}, "train": {"steps": 2, "micro_batch": 8}}
    made = api.post("/api/jobs/", spec, format="json")
    assert made.status_code == 201, made.json()
    # the same model on one rank fits no GPU of that host
    assert api.post("/api/jobs/", BIG, format="json").status_code == 400


def test_with_no_host_registered_nothing_is_refused(api):
    assert not Host.objects.exists()
    assert api.post("/api/jobs/", BIG, format="json").status_code == 201


def test_the_planner_says_why_a_job_would_be_refused(api):
    host("small-cpu", cpu_bytes=32 * GB)
    too_big = api.get("/api/plan/", {"preset": "ling-mini-2.0"}).json()
    assert "largest device of a registered host holds 32.0 GB (small-cpu: memory)" in too_big[
        "refused"]
    assert api.get("/api/plan/", {"preset": "nano"}).json()["refused"] is None


def test_a_staff_user_is_refused_a_model_no_host_holds_too(django_user_model):
    root = django_user_model.objects.create_user("root", password="pw-root-123", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {ApiToken.objects.create(user=root).key}")
    host("small-cpu", cpu_bytes=32 * GB)
    assert client.post("/api/jobs/", BIG, format="json").status_code == 400
