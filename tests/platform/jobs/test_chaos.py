"""Chaos: the platform loses no job and no stored data point when its own processes die.

Each test starts the parts it breaks as subprocesses of its own, on a Celery queue of its own
and against the session's test database: two Celery workers (the job's supervisor runs in one)
and Celery beat running the real reaper (`jobs.tasks.reap`), or for the Redis test the whole
of `manage.py serve` with the redis-server it starts; the reaper's intervals are shortened
through the environment. The job is a real nano run with disk checkpoints. The process
helpers are bench/worker_loss.py's, which measures the same loss at the default intervals.
"""

from __future__ import annotations

import os
import re
import sys

import psutil
import pytest

from bench.worker_loss import (
    Processes,
    lose_machine,
    steady_spec,
    submit,
    supervising,
    trained_past_a_checkpoint,
)
from common.services import REPO_ROOT
from engine.checkpoint import find_latest_good
from engine.ports import free_port
from engine.runtime.events import read_events
from hosts.models import Host
from jobs.commands import issue
from jobs.models import Cause, CommandKind, Job, State
from jobs.tasks import checkpoint_folder, run_dir, run_job
from monitor.models import Event, MetricPoint
from ringside.celery import app

pytestmark = pytest.mark.django_db(transaction=True)

# the reaper's settings, shortened so that a lost supervisor is found within seconds (the
# timeout still ten beats long, so that a supervisor slowed by a busy machine is not reaped)
FAST_REAPER = {"JOB_HEARTBEAT_S": "0.5", "JOB_HEARTBEAT_TIMEOUT_S": "5",
               "JOB_REAPER_INTERVAL_S": "1"}
# A checkpoint at step 50, the loss or pause once the job is past step 60: the 240 steps left
# (seconds of training on an idle machine, more on a busy one) keep the job running through the
# break, and the job trains no more steps than that needs (a step costs ~0.02 s of CPU).
STEPS = 300
CHECKPOINT_EVERY = 50


@pytest.fixture
def parts(service_env, tmp_path):
    queue = f"chaos-{os.getpid()}-{tmp_path.name}"
    started = Processes({**service_env, **FAST_REAPER, "CELERY_QUEUE": queue}, tmp_path)
    yield started
    started.stop_all()


def place_only_on(names: list[str], eventually) -> None:
    """Once the test's worker hosts are up, drain every other (the session's worker host,
    which beats every second, is back from the last test's flush by then): no job of this test
    is placed elsewhere."""
    eventually(lambda: set(names) <= set(Host.objects.up().values_list("name", flat=True)), 60,
               "the test's worker hosts register")
    Host.objects.exclude(name__in=names).update(drained=True)


def chaos_job(user, name: str) -> Job:
    """Long enough (a few hundred fast steps) to be broken mid-run, with disk checkpoints."""
    return Job.objects.create(name=name, owner=user,
                              spec=steady_spec(name, STEPS, CHECKPOINT_EVERY))


def stored_losses(job: Job) -> list[tuple[int, float | None]]:
    return list(MetricPoint.objects.filter(job=job, name="loss").order_by("step")
                .values_list("step", "value"))


def assert_every_step_stored_once_as_last_trained(job: Job) -> None:
    """The stored loss series has every step once (no gap, no duplicate), each with the loss
    the engine reported last for it (a step trained again replaces its earlier value)."""
    losses = stored_losses(job)
    assert [step for step, _ in losses] == list(range(1, STEPS + 1))
    events = read_events(run_dir(job) / "events.jsonl")
    assert dict(losses) == {e["step"]: e["loss"] for e in events if e["type"] == "step"}


def test_a_job_whose_worker_machine_is_lost_is_resumed_by_another_worker_from_its_newest_checkpoint(
        parts, user, eventually):
    job = chaos_job(user, "chaos-worker")
    workers = [parts.worker("first", concurrency=2), parts.worker("second", concurrency=2)]
    parts.beat()
    place_only_on([parts.host_name("first"), parts.host_name("second")], eventually)
    submit(job.pk)
    eventually(lambda: supervising(job.pk, workers) is not None, 60,
               f"no worker started the job; {parts.logs()}")
    doomed = supervising(job.pk, workers)
    survivor = next(w for w in workers if w is not doomed)
    eventually(lambda: trained_past_a_checkpoint(job.pk, CHECKPOINT_EVERY), 60,
               f"the job wrote no checkpoint; {parts.logs()}")

    lost_supervisor = Job.objects.get(pk=job.pk).supervisor
    lose_machine(doomed)
    newest, _ = find_latest_good(checkpoint_folder(job))
    assert newest is not None and Job.objects.get(pk=job.pk).step < STEPS

    eventually(lambda: supervising(job.pk, [survivor]) is not None, 30,
               f"the other worker did not take the job over; {parts.logs()}")
    eventually(lambda: Job.objects.get(pk=job.pk).is_terminal, 60,
               f"the job did not finish after the loss; {parts.logs()}")
    job.refresh_from_db()
    assert job.state == State.COMPLETED, job.error
    assert job.launches == 2 and job.step == STEPS
    assert list(job.transitions.values_list("to_state", flat=True)) == [
        "starting", "running", "queued", "starting", "running", "completing", "completed"]
    lost = job.transitions.get(to_state=State.QUEUED)
    assert (lost.from_state, lost.cause) == (State.RUNNING, Cause.WORKER_LOSS)
    assert "stopped beating" in lost.message and lost_supervisor in lost.message

    resumed = [e for e in Event.objects.filter(job=job, type="log")
               if e.data["message"].startswith("resumed at step")]
    assert [e.step for e in resumed] == [newest.step]
    assert_every_step_stored_once_as_last_trained(job)


def test_a_run_goes_on_through_a_redis_restart_and_loses_no_stored_metric(
        parts, user, eventually, tmp_path):
    """The platform as `make run` runs it (`manage.py serve`: its embedded Redis, a worker and
    beat), with the Redis it started for this test killed mid-run and restarted by `serve`."""
    env = {**parts.env, "RINGSIDE_VAR_DIR": str(tmp_path / "var"), "PORT": str(free_port())}
    del env["REDIS_URL"]  # so `serve` starts its own Redis
    serve = parts.start("serve", [sys.executable, str(REPO_ROOT / "manage.py"), "serve"], env)
    eventually(lambda: "Ringside is up" in parts.log("serve"), 60,
               f"serve did not start; {parts.logs()}")
    redis_url = re.search(r"embedded Redis on (\S+)", parts.log("serve")).group(1)
    job = chaos_job(user, "chaos-redis")
    with app.connection_for_write(redis_url) as connection:
        run_job.apply_async((job.pk,), queue=env["CELERY_QUEUE"], connection=connection)
    eventually(lambda: trained_past_a_checkpoint(job.pk, CHECKPOINT_EVERY), 60,
               f"the job wrote no checkpoint; {parts.logs()}")

    redis_server = next(p for p in psutil.Process(serve.pid).children()
                        if "redis-server" in " ".join(p.cmdline()))
    # the engine keeps its events while Redis is away and its supervisor keeps beating, so
    # the run goes on: never relaunched
    redis_server.kill()
    eventually(lambda: "redis restarted" in parts.log("serve"), 15,
               f"serve did not restart Redis; {parts.logs()}")

    eventually(lambda: Job.objects.get(pk=job.pk).is_terminal, 90,
               f"the job did not finish after the restart; {parts.logs()}")
    job.refresh_from_db()
    assert job.state == State.COMPLETED, job.error
    assert job.step == STEPS
    assert job.launches == 1, parts.logs()
    assert_every_step_stored_once_as_last_trained(job)


def test_a_warm_paused_job_whose_worker_machine_is_lost_stays_paused_and_resumes(
        parts, user, eventually):
    job = chaos_job(user, "chaos-warm")
    doomed = parts.worker("first", concurrency=2)
    parts.worker("second", concurrency=2)  # runs the reaper once the first is gone
    parts.beat()
    place_only_on([parts.host_name("first"), parts.host_name("second")], eventually)
    Host.objects.filter(name=parts.host_name("second")).update(drained=True)
    submit(job.pk)
    eventually(lambda: trained_past_a_checkpoint(job.pk, CHECKPOINT_EVERY), 90,
               f"the job wrote no checkpoint; {parts.logs()}")
    pause = issue(job, CommandKind.PAUSE, {"mode": "warm"}, actor="ada", cause=Cause.USER)
    eventually(lambda: Job.objects.get(pk=job.pk).state == State.PAUSED_WARM, 60,
               f"the job did not pause warm; {parts.logs()}")

    lose_machine(doomed)
    eventually(lambda: Job.objects.get(pk=job.pk).state != State.PAUSED_WARM, 30,
               f"the reaper did not find the lost worker; {parts.logs()}")
    job.refresh_from_db()
    newest, _ = find_latest_good(checkpoint_folder(job))
    assert job.state == State.PAUSED  # not requeued to train on
    last = job.transitions.last()
    assert (last.from_state, last.cause) == (State.PAUSED_WARM, Cause.WORKER_LOSS)
    assert f"paused at its newest checkpoint (step {newest.step})" in last.message
    pause.refresh_from_db()
    assert pause.state == "done"

    Host.objects.filter(name=parts.host_name("second")).update(drained=False)
    resume = issue(job, CommandKind.RESUME, {}, actor="ada", cause=Cause.USER)
    # resumable: queued again, to continue from that checkpoint on the other worker (which may
    # have started it already: the transition says what the resume did, the state may not)
    resumed_to = job.transitions.filter(from_state=State.PAUSED).last().to_state
    assert (resume.state, resumed_to) == ("done", State.QUEUED)
    # placed, launched and trained from the checkpoint (step 50 or later) to the end: the
    # first test's takeover and finish (30 + 60 s) for as many steps (a busy host's run was
    # at step 594 of 600 after 90 s, when the jobs had 600 steps)
    eventually(lambda: Job.objects.get(pk=job.pk).is_terminal, 120,
               lambda: f"the resumed job did not finish ({Job.objects.get(pk=job.pk).state} at "
                       f"step {Job.objects.get(pk=job.pk).step}); {parts.logs()}")
    job.refresh_from_db()
    assert job.state == State.COMPLETED, job.error
    resumed = [e.step for e in Event.objects.filter(job=job, type="log")
               if e.data["message"].startswith("resumed at step")]
    assert resumed == [newest.step]
    assert_every_step_stored_once_as_last_trained(job)
