"""A warm pause through the platform: the API takes the mode and hands the engine its limit,
refuses a bad body naming the field, and a warm-paused job is resumed by its running engine."""


import psutil
import pytest
from django.conf import settings

from jobs.models import Command, Job, State
from tests.platform.jobs.test_steering import control_commands
from tests.policies import paced

pytestmark = pytest.mark.django_db(transaction=True)


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


def launched(api, small_spec: dict, eventually, worker) -> int:
    """A long nano job on two ranks, through the API, once it trains; paced (tests.policies),
    as it only has to keep running while the test steers it."""
    small_spec["name"] = "warm"
    small_spec["train"]["steps"] = 100_000
    small_spec["parallel"] = {"nodes": 1, "procs_per_node": 2}
    small_spec["faults"] = paced(2)
    job_id = api.post("/api/jobs/", small_spec, format="json").json()["id"]
    eventually(lambda: Job.objects.get(pk=job_id).step >= 2, 120,
               f"job {job_id} made no progress; worker log: {worker.log_path}")
    return job_id


def ranks(job_id: int) -> set[int]:
    """The PIDs of the job's engine: its launcher (which names the run folder) and its ranks."""
    run_dir = str(settings.RUNS_DIR / str(job_id))
    launchers = [p for p in psutil.process_iter(["cmdline"])
                 if run_dir in (p.info["cmdline"] or [])]
    return {p.pid for launcher in launchers for p in [launcher, *launcher.children(True)]}


def test_a_warm_paused_job_keeps_its_engine_beating_and_resume_reaches_it(
        api, celery_worker, small_spec, eventually):
    job_id = launched(api, small_spec, eventually, celery_worker)
    engine = ranks(job_id)
    assert api.post(f"/api/jobs/{job_id}/pause/", {"mode": "warm"},
                    format="json").status_code == 202
    eventually(lambda: Job.objects.get(pk=job_id).state == State.PAUSED_WARM, 60,
               "the job did not pause warm")
    paused = Job.objects.get(pk=job_id)
    # the supervisor beats on while the engine idles: the worker stays held, the reaper away
    eventually(lambda: Job.objects.get(pk=job_id).heartbeat_at > paused.heartbeat_at, 15,
               "no heartbeat while paused warm")
    assert Job.objects.get(pk=job_id).step == paused.step  # it trains no more
    assert api.get(f"/api/jobs/{job_id}/").json()["state"] == "paused_warm"

    resume = api.post(f"/api/jobs/{job_id}/resume/", {}, format="json").json()
    assert resume["state"] == "delivered"  # to the running engine, not queued
    # the supervisor stores a batch (the step moves) before it applies the batch's state event
    eventually(lambda: (job := Job.objects.get(pk=job_id)).step > paused.step
               and job.state == State.RUNNING, 30, "it did not go on")
    job = Job.objects.get(pk=job_id)
    assert job.launches == 1
    assert ranks(job_id) == engine  # the same processes
    assert Command.objects.get(pk=resume["id"]).state == "done"
    moves = list(job.transitions.values_list("to_state", flat=True))
    assert moves[-3:] == ["pausing", "paused_warm", "running"]

    # a cancel reaches a warm-paused engine too
    api.post(f"/api/jobs/{job_id}/pause/", {"mode": "warm"}, format="json")
    eventually(lambda: Job.objects.get(pk=job_id).state == State.PAUSED_WARM, 60,
               "the job did not pause warm again")
    assert api.post(f"/api/jobs/{job_id}/cancel/", {}, format="json").status_code == 202
    eventually(lambda: Job.objects.get(pk=job_id).state == State.CANCELLED, 30,
               "the warm-paused job was not cancelled")


def test_a_warm_pause_past_its_limit_becomes_a_cold_pause_that_frees_the_worker(
        api, celery_worker, small_spec, eventually):
    job_id = launched(api, small_spec, eventually, celery_worker)
    api.post(f"/api/jobs/{job_id}/pause/", {"mode": "warm", "max_s": 1}, format="json")
    eventually(lambda: Job.objects.get(pk=job_id).state == State.PAUSED, 90,
               f"the warm pause did not turn cold; worker log: {celery_worker.log_path}")
    job = Job.objects.get(pk=job_id)
    assert not ranks(job_id)  # the engine exited: the worker is free
    last = job.transitions.last()
    assert (last.from_state, last.to_state) == ("paused_warm", "paused")
    assert last.message.startswith("warm pause exceeded 1 s: checkpointed and stopped")
    assert api.post(f"/api/jobs/{job_id}/cancel/", {}, format="json").status_code == 202
