"""`jobs.tasks.run_job` with a real Celery worker, Redis and database, and the real engine."""

import time
from datetime import timedelta

import psutil
import pytest
from django.conf import settings
from django.db import OperationalError
from django.utils import timezone

from engine.runtime.confine import SERVER_PATH
from hosts.models import Host
from jobs.confinement import uploads_dir
from jobs.launch import stderr_path
from jobs.models import Cause, Command, CommandKind, Job, State
from jobs.supervisor import EngineReport, finish
from monitor.models import Event, MetricPoint
from tests.platform.jobs.test_placement import host
from tests.platform.jobs.test_warm_pause import launched

pytestmark = pytest.mark.django_db(transaction=True)


def job_state(job_id: int) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def engine_processes(spec_path: str) -> list[psutil.Process]:
    """The engine's launcher (its command line names the spec) and all its ranks."""
    launchers = [p for p in psutil.process_iter(["cmdline"])
                 if spec_path in (p.info["cmdline"] or [])]
    return launchers + [child for p in launchers for child in p.children(recursive=True)]


def test_cancel_stops_the_ranks_within_seconds(api, celery_worker, small_spec, eventually,
                                               settings):
    job_id = launched(api, small_spec, eventually, celery_worker)
    spec_path = str(settings.RUNS_DIR / str(job_id) / "spec.json")
    engine = engine_processes(spec_path)
    assert len(engine) >= 3, "expected the launcher and its two ranks"

    requested = time.monotonic()
    assert api.post(f"/api/jobs/{job_id}/cancel/").status_code == 202
    eventually(lambda: job_state(job_id) == State.CANCELLED, 30, "cancel did not finish")
    eventually(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                               for p in engine), 10, "engine processes survived")
    took = time.monotonic() - requested
    assert took < 10, f"cancel took {took:.1f} s"
    last = Job.objects.get(pk=job_id).transitions.last()
    assert (last.from_state, last.to_state, last.cause, last.actor) == (
        "running", "cancelled", "api_token", "ada")


def test_a_configuration_error_fails_the_job_at_once_with_the_engines_message(
        api, user, celery_worker, small_spec, eventually):
    corpus = uploads_dir(user) / "broken.jsonl"  # read, by the user's own rights, then refused
    corpus.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_text("not json\n")
    small_spec["train"]["dataset"] = {"kind": "jsonl", "paths": [corpus.name]}
    job_id = api.post("/api/jobs/", small_spec, format="json").json()["id"]
    eventually(lambda: job_state(job_id) in (State.FAILED, State.COMPLETED), 120,
               f"job {job_id} did not finish; worker log: {celery_worker.log_path}")
    job = Job.objects.get(pk=job_id)
    assert job.state == State.FAILED
    # the user's own file is named, not scrubbed; nothing was retried
    assert job.error.startswith(f"train.dataset.paths: {corpus} at byte 0 is not JSON")
    assert job.launches == 1 and job.transitions.last().cause == "engine"


def test_an_engine_that_dies_fails_the_job_with_the_tail_of_its_stderr(user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    job.start(supervisor="test")
    job.mark_running()
    stderr_path(job).parent.mkdir(parents=True, exist_ok=True)
    stderr_path(job).write_text(f"Traceback\n  File \"{settings.REPO_ROOT}/engine/x.py\"\n"
                                "RuntimeError: out of luck\n")
    finish(job, 1, EngineReport())
    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.error == ("the engine exited with code 1\n\n--- engine stderr (tail) ---\n"
                         f"Traceback\n  File \"{SERVER_PATH}\"\nRuntimeError: out of luck")


def test_a_redelivered_task_leaves_a_beating_job_alone_and_resumes_a_lost_one(
        user, small_spec, settings):
    from jobs.tasks import run_job

    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    job.start(supervisor="elsewhere")
    job.mark_running()
    assert run_job(job.pk) == State.RUNNING  # its supervisor still beats: not ours to take
    assert job.transitions.count() == 2

    Job.objects.filter(pk=job.pk).update(
        heartbeat_at=timezone.now() - timedelta(seconds=settings.JOB_HEARTBEAT_TIMEOUT_S + 1))
    assert run_job(job.pk) == State.COMPLETED
    moves = list(job.transitions.values_list("from_state", "to_state", "cause"))
    assert moves[2] == ("running", "queued", "worker_loss")
    assert [m[1] for m in moves[3:]] == ["starting", "running", "completing", "completed"]
    job.refresh_from_db()
    assert job.launches == 2 and job.step == 6


REFUSED_STARTS = 20  # more than any fixed number of tries would have allowed


def test_a_start_the_database_refuses_is_tried_until_it_takes_and_the_job_runs(
        user, small_spec, monkeypatch):
    from jobs.tasks import run_job

    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    refused, start = [], Job.start

    def start_refused_for_a_while(self: Job, supervisor: str = ""):
        if len(refused) < REFUSED_STARTS:
            refused.append(supervisor)
            raise OperationalError("deadlock detected")
        return start(self, supervisor)

    monkeypatch.setattr(Job, "start", start_refused_for_a_while)
    run_job.apply(args=(job.pk,))  # eager: its retries run here too, at once
    job.refresh_from_db()
    assert len(refused) == REFUSED_STARTS
    assert (job.state, job.launches, job.step) == (State.COMPLETED, 1, 6)


def test_a_warm_paused_job_whose_supervisor_is_lost_stays_paused(user, small_spec, settings):
    from jobs.tasks import reap, run_job

    def warm_paused_and_lost(name: str) -> Job:
        job = Job.objects.create(name=name, owner=user, spec=small_spec)
        job.start(supervisor="elsewhere")
        job.mark_running()
        job.request_pause(Cause.USER, "ada")
        job.mark_paused_warm("the ranks idle in memory")
        Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(
            seconds=settings.JOB_HEARTBEAT_TIMEOUT_S + 1))
        return job

    reaped = warm_paused_and_lost("reaped")
    assert reap() == []  # found by the reaper: not requeued
    redelivered = warm_paused_and_lost("redelivered")
    assert run_job(redelivered.pk) == State.PAUSED  # found by its redelivered task: the same
    for job in (reaped, redelivered):
        last = job.transitions.last()
        assert (last.from_state, last.to_state, last.cause) == ("paused_warm", "paused",
                                                                 "worker_loss")
        assert "paused at no checkpoint (step 0), where resume continues" in last.message


def test_a_job_pausing_when_its_supervisor_is_lost_is_paused_if_a_person_asked(
        user, small_spec, settings):
    from jobs.commands import issue
    from jobs.tasks import reap

    def pausing_and_lost(cause: str) -> Job:
        job = Job.objects.create(name=cause, owner=user, spec=small_spec)
        job.start(supervisor="elsewhere")
        job.mark_running()
        issue(job, CommandKind.SET, {"train.lr": 0.01}, actor="ada", cause=Cause.USER)
        issue(job, CommandKind.PAUSE, {}, actor="ada", cause=cause)
        Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(
            seconds=settings.JOB_HEARTBEAT_TIMEOUT_S + 1))
        return job

    asked = pausing_and_lost(Cause.USER)
    regrouping = pausing_and_lost(Cause.SCHEDULER)
    host("spare")  # free slots: the requeued job is placed in the same pass, and named once
    assert reap() == [regrouping.pk]  # the scheduler's pause moves the job: requeued
    asked.refresh_from_db()
    assert asked.state == State.PAUSED
    assert asked.transitions.last().message.endswith(
        "while pausing: the ranks' memory is gone; paused at no checkpoint (step 0), where "
        "resume continues")
    # every command is settled: the pause carried out, the set ended with the reason
    change, pause = asked.commands.order_by("pk")
    assert (pause.state, pause.result["state"]) == ("done", "paused")
    assert change.state == "refused" and "before the engine acted on it" in change.result["error"]
    assert not Command.open_for(regrouping).exists()


def test_a_job_created_through_the_api_runs_once_the_broker_is_back_and_stores_its_metrics(
        api, celery_worker, small_spec, broker_down, eventually, settings):
    """A job created while the broker is down is accepted, and started once it is back; then
    it runs, completes and stores its metrics as any job does (one launch shows both: a job
    created while the broker is up goes through the same dispatch, at once)."""
    from jobs.tasks import reap

    # the worker's host, registered again after the last test's flush, is drained while the
    # broker is down: the worker's own scheduling passes (one follows its registration) reach
    # the broker and would otherwise start the job before the reaper is looked at
    eventually(lambda: Host.objects.up().exists(), 30, "the worker's host registers")
    Host.objects.update(drained=True)
    response = api.post("/api/jobs/", small_spec, format="json")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    job = Job.objects.get(pk=job_id)
    assert job.state == State.QUEUED and job.undispatched_since is not None

    settings.JOB_REAPER_INTERVAL_S = 0  # no grace: the reaper looks at it at once
    broker_down()
    Host.objects.update(drained=False)
    assert reap() == [job_id]
    assert Job.objects.get(pk=job_id).undispatched_since is None
    assert reap() == []  # sent once

    eventually(lambda: job_state(job_id) in (State.COMPLETED, State.FAILED), 120,
               f"job {job_id} did not finish; worker log: {celery_worker.log_path}")
    job = Job.objects.get(pk=job_id)
    assert job.state == State.COMPLETED, job.error
    assert job.step == 6
    assert list(job.transitions.values_list("to_state", flat=True)) == [
        "starting", "running", "completing", "completed"]
    losses = list(MetricPoint.objects.filter(job=job, name="loss").order_by("step")
                  .values_list("step", "value"))
    assert [s for s, _ in losses] == [1, 2, 3, 4, 5, 6]
    assert all(v is not None and v > 0 for _, v in losses)
    assert MetricPoint.objects.filter(job=job, name="tokens_per_s").count() == 6
    states = [e.data["state"] for e in Event.objects.filter(job=job, type="state")]
    assert states[0] == "starting" and states[-1] == "completed"
    run_dir = settings.RUNS_DIR / str(job_id)
    assert (run_dir / "spec.json").exists() and (run_dir / "events.jsonl").exists()
    series = api.get(f"/api/jobs/{job_id}/metrics/").json()["series"]
    assert series["loss"]["step"] == [1, 2, 3, 4, 5, 6]
