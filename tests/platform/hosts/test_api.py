"""`/api/hosts/`: every host with its devices, the slots its jobs' reservations hold (released
ones free again), its state, beat age, version and clock; staff drain and undrain (others get
403); the schema documents it all."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from hosts import registry, status
from hosts.models import Host
from jobs.models import ApiToken, Job, Reservation

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("session_worker_host_hidden")]


def host(name: str, slots: int = 4, beat_s_ago: float = 0, **fields) -> Host:
    return Host.objects.create(**{
        "name": name, "address": f"10.0.0.{Host.objects.count() + 1}", "slots": slots,
        "devices": {"cpu": {"cores": 8, "memory_bytes": 2**34}, "gpus": []},
        "version": registry.version(), "instance": "x", "clock_offset_s": 0.25,
        "beat_at": timezone.now() - timedelta(seconds=beat_s_ago), **fields})


@pytest.fixture
def staff_api(django_user_model):
    root = django_user_model.objects.create_user("root", password="pw-root-123", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {ApiToken.objects.create(user=root).key}")
    return client


@pytest.fixture
def held(user):
    """Host "a" with a job holding slots 0 and 1 (and an older, released reservation)."""
    a = host("a")
    job = Job.objects.create(name="big", owner=user, spec={"name": "big"})
    Reservation.objects.create(job=job, host=a, incarnation=1, node_rank=0, slots=[0, 1])
    Reservation.objects.create(job=job, host=a, incarnation=0, node_rank=0, slots=[2, 3],
                               released_at=timezone.now())
    return job


def test_the_list_shows_each_hosts_devices_slots_jobs_and_beat(api, held):
    host("b", slots=2, beat_s_ago=40, version="0.0.1+old")
    answer = api.get("/api/hosts/")
    assert answer.status_code == 200
    a, b = answer.json()
    assert a["name"] == "a" and a["devices"]["cpu"]["cores"] == 8
    assert (a["slots"], a["slots_used"], a["slots_free"]) == (4, 2, 2)
    assert a["jobs"] == [{"job": held.pk, "name": "big", "node_rank": 0, "slots": [0, 1]}]
    assert a["state"] == "up" and 0 <= a["beat_age_s"] < 5 and a["clock_offset_s"] == 0.25
    assert a["version_differs"] is False
    assert (b["state"], b["slots_used"], b["slots_free"], b["jobs"]) == ("lost", 0, 2, [])
    assert b["beat_age_s"] >= 40 and b["version_differs"] is True
    assert status.slots_used(Host.objects.get(name="a")) == 2


def test_one_host_by_name_and_a_missing_one_is_404(api):
    host("gpu-1.rack2")
    assert api.get("/api/hosts/gpu-1.rack2/").json()["name"] == "gpu-1.rack2"
    assert api.get("/api/hosts/nope/").status_code == 404


def test_staff_drain_and_undrain_and_others_are_refused(api, staff_api):
    host("a")
    assert api.post("/api/hosts/a/drain/").status_code == 403
    assert not Host.objects.get().drained
    drained = staff_api.post("/api/hosts/a/drain/")
    assert drained.status_code == 200 and drained.json()["state"] == "drained"
    assert list(Host.objects.up()) == []
    assert api.post("/api/hosts/a/undrain/").status_code == 403
    undrained = staff_api.post("/api/hosts/a/undrain/")
    assert undrained.json()["state"] == "up" and list(Host.objects.up()) == [Host.objects.get()]
    assert staff_api.post("/api/hosts/nope/drain/").status_code == 404


def test_anonymous_clients_are_refused():
    assert APIClient().get("/api/hosts/").status_code == 401


def test_the_schema_documents_the_hosts_api(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert {"/api/hosts/", "/api/hosts/{name}/", "/api/hosts/{name}/drain/",
            "/api/hosts/{name}/undrain/"} <= set(schema["paths"])
    fields = schema["components"]["schemas"]["Host"]["properties"]
    assert {"slots_used", "slots_free", "state", "beat_age_s", "version_differs",
            "clock_offset_s", "jobs"} <= set(fields)


def test_another_users_job_is_a_job_of_another_user_and_staff_see_whose(
        api, held, other_user, staff_api):
    mine = Job.objects.create(name="mine", owner=other_user, spec={"name": "mine"})
    Reservation.objects.create(job=mine, host=Host.objects.get(name="a"), incarnation=1,
                               node_rank=0, slots=[2])
    theirs = APIClient()
    theirs.credentials(HTTP_AUTHORIZATION=f"Token {ApiToken.objects.create(user=other_user).key}")
    for answer in (theirs.get("/api/hosts/").json()[0], theirs.get("/api/hosts/a/").json()):
        assert sorted(answer["jobs"], key=lambda j: j["slots"]) == [
            {"job": None, "name": status.OTHERS_JOB, "node_rank": 0, "slots": [0, 1]},
            {"job": mine.pk, "name": "mine", "node_rank": 0, "slots": [2]}]
        assert answer["slots_used"] == 3
    seen_by_staff = staff_api.get("/api/hosts/").json()[0]["jobs"]
    assert {j["name"] for j in seen_by_staff} == {"big", "mine"}
    assert {j["job"] for j in seen_by_staff} == {held.pk, mine.pk}
