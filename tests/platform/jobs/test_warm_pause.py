"""A warm pause through the platform: the API takes the mode and hands the engine its limit,
refuses a bad body naming the field, and a warm-paused job is resumed by its running engine."""

import json

import pytest
import redis
from django.conf import settings

from engine.runtime.events import control_stream
from jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running(user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    job.start(supervisor="test")
    job.mark_running()
    return job


def control_commands(job: Job) -> list[dict]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    entries = client.xrange(control_stream(str(job.pk)))
    client.close()
    return [json.loads(fields[b"command"]) for _, fields in entries]


def test_a_warm_pause_is_stored_as_asked_and_the_engine_gets_the_platforms_limit(
        api, running, settings):
    settings.JOB_WARM_PAUSE_MAX_S = 90.0
    response = api.post(f"/api/jobs/{running.pk}/pause/", {"mode": "warm"}, format="json")
    assert response.status_code == 202, response.json()
    assert response.json()["args"] == {"mode": "warm"}
    assert control_commands(running)[-1]["args"] == {"mode": "warm", "max_s": 90.0}


def test_a_pause_names_its_own_limit_and_a_cold_one_stays_as_it_was(api, running, user,
                                                                     small_spec):
    api.post(f"/api/jobs/{running.pk}/pause/", {"mode": "warm", "max_s": 30}, format="json")
    assert control_commands(running)[-1]["args"] == {"mode": "warm", "max_s": 30.0}

    cold = Job.objects.create(name="c", owner=user, spec=small_spec)
    cold.start(supervisor="test")
    cold.mark_running()
    response = api.post(f"/api/jobs/{cold.pk}/pause/", {}, format="json")
    assert response.status_code == 202 and response.json()["args"] == {}
    assert control_commands(cold) == [{"kind": "pause", "args": {},
                                       "id": str(response.json()["id"])}]


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"mode": "tepid"}, "mode", "not a valid choice"),
    ({"mode": "warm", "max_s": 0}, "max_s", "greater than or equal to 1"),
    ({"mode": "warm", "max_s": "soon"}, "max_s", "valid number"),
    ({"mode": "cold", "max_s": 30}, "max_s", "only a warm pause has a limit"),
])
def test_a_bad_pause_body_is_refused_naming_the_field(api, running, body, field, message):
    response = api.post(f"/api/jobs/{running.pk}/pause/", body, format="json")
    assert response.status_code == 400
    assert message in str(response.json()[field])
    running.refresh_from_db()
    assert running.state == "running" and control_commands(running) == []
