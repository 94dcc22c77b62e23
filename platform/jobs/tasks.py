"""`run_job`, the supervisor of one training job, run by a Celery worker.

It launches the engine (`python -m engine.train`) in its own process group, drives the job's
ingest (bus → database → websockets), follows the engine's `state` events to move the job,
carries out cancel requests (SIGTERM to the process group, SIGKILL after a grace period), and
records how the engine ended. The Celery task is acknowledged late, so a worker that dies
mid-job hands the task back; the redelivered task finds the job already started and marks it
failed with cause `worker_loss` (resuming from a checkpoint comes with the reaper of issue 8).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import redis
from celery import shared_task
from django.conf import settings

from jobs.models import Cause, IllegalTransition, Job, State
from monitor.ingest import StreamIngest, forward
from ringside.services import child_env

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.5
STDERR_TAIL_LINES = 40


def run_dir(job: Job) -> Path:
    return settings.RUNS_DIR / str(job.pk)


def engine_command(job: Job, spec_path: Path) -> list[str]:
    folder = spec_path.parent
    return [
        sys.executable, "-m", "engine.train", str(spec_path),
        "--bus", settings.REDIS_URL, "--job", str(job.pk),
        "--events", str(folder / "events.jsonl"), "--run-dir", str(folder),
    ]


def _stderr_tail(path: Path) -> str:
    with path.open(encoding="utf-8", errors="replace") as f:
        return "".join(deque(f, maxlen=STDERR_TAIL_LINES)).strip()


def _notify_state(job: Job, seq: int) -> None:
    forward(job.pk, [{"type": "job", "seq": seq, "state": job.state, "step": job.step,
                      "error": job.error}])


@shared_task(name="jobs.tasks.run_job")
def run_job(job_id: int) -> str:
    """Supervise job `job_id` from launch to its final state; returns that state."""
    job = Job.objects.get(pk=job_id)
    if job.state in (State.STARTING, State.RUNNING, State.COMPLETING):
        job.fail("its supervisor was lost (worker stopped) while the job was "
                 f"{job.state}", cause=Cause.WORKER_LOSS)
        return job.state
    if job.state != State.QUEUED:
        return job.state  # cancelled while it waited in the queue
    job.start()
    folder = run_dir(job)
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(job.spec, indent=2), encoding="utf-8")
    client = redis.Redis.from_url(settings.REDIS_URL)
    ingest = StreamIngest(job.pk, client, consumer=f"supervisor-{job.pk}")
    _notify_state(job, ingest.last_seq)

    stderr_path = folder / "stderr.log"
    with (folder / "stdout.log").open("wb") as out, stderr_path.open("wb") as err:
        # its own process group, so cancel signals reach the launcher and every rank
        proc = subprocess.Popen(engine_command(job, spec_path), cwd=settings.REPO_ROOT,
                                env=child_env(), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    log.info("job %s: engine started, pid %s", job.pk, proc.pid)
    try:
        engine = _supervise(job, proc, ingest)
    except BaseException:
        # the supervisor can no longer follow the run (database or Redis gone, or the task is
        # being torn down): stop the engine rather than leave ranks training unobserved; the
        # job stays as it is for the redelivered task (or the reaper) to settle
        _kill_group(proc, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        client.close()
    _finish(job, proc.returncode, engine, stderr_path)
    _notify_state(job, ingest.last_seq)
    return job.state


@dataclass
class EngineReport:
    """What the engine's last `state` event said."""

    state: str = ""
    error: str = ""
    reason: str = ""


def _supervise(job: Job, proc: subprocess.Popen, ingest: StreamIngest) -> EngineReport:
    """Pump events until the engine exits; carry out a cancel request on the way."""
    engine = EngineReport()
    sigterm_sent = False
    kill_at: float | None = None
    last_check = 0.0
    while True:
        exited = proc.poll() is not None
        events = ingest.drain() if exited else ingest.poll(block_ms=int(CANCEL_POLL_S * 1000))
        for event in events:
            if event["type"] != "state":
                continue
            engine = EngineReport(event.get("state", ""), event.get("error", engine.error),
                                  event.get("reason", ""))
            if engine.state == "running" and job.state == State.STARTING:
                job.mark_running()
                _notify_state(job, event["seq"])
            elif engine.state == "completed" and job.state in (State.STARTING, State.RUNNING):
                job.begin_completing()
                _notify_state(job, event["seq"])
        if exited:
            return engine
        now = time.monotonic()
        if now - last_check >= CANCEL_POLL_S:
            last_check = now
            job.refresh_from_db(fields=["cancel_requested_at", "cancel_cause", "cancel_actor"])
            if job.cancel_requested_at and not sigterm_sent:
                log.info("job %s: cancel requested, SIGTERM to the engine", job.pk)
                _kill_group(proc, signal.SIGTERM)
                sigterm_sent, kill_at = True, now + settings.JOB_CANCEL_GRACE_S
        if kill_at is not None and now >= kill_at:
            log.warning("job %s: engine still alive after SIGTERM, SIGKILL", job.pk)
            _kill_group(proc, signal.SIGKILL)
            kill_at = None


def _kill_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _finish(job: Job, returncode: int, engine: EngineReport, stderr_path: Path) -> None:
    job.refresh_from_db()
    try:
        if job.cancel_requested_at:
            job.finish_cancel(f"engine stopped on request (exit code {returncode})")
        elif returncode == 0:
            if job.state != State.COMPLETING:
                job.begin_completing()
            job.complete()
        else:
            reason = engine.error or f"the engine exited with code {returncode}"
            if engine.state == "cancelled":  # e.g. the platform shutting down (Ctrl-C)
                reason = (f"the engine was stopped from outside the platform "
                          f"({engine.reason or 'a signal'}; exit code {returncode})")
            if returncode < 0:
                reason = f"the engine was killed by signal {signal.Signals(-returncode).name}"
            tail = _stderr_tail(stderr_path)
            job.fail(f"{reason}\n\n--- engine stderr (tail) ---\n{tail}" if tail else reason)
    except IllegalTransition:
        log.exception("job %s: could not record the engine's end (exit %s)", job.pk, returncode)
