"""The Celery tasks: `run_job`, the supervisor of one training job, and `reap`, which finds
lost supervisors and unsent tasks.

`run_job` takes the queued job and supervises one launch of its engine (jobs.supervisor) to
its final state or its pause; resuming queues `run_job` again (jobs.dispatch), and every launch
after the first continues from the newest good checkpoint.

Worker loss: the task is acknowledged late and handed back if its worker process dies; the
engine gets SIGTERM when its supervisor dies (Linux parent-death signal), so no rank trains
unobserved. While it owns the job the supervisor beats `Job.heartbeat_at`; `reap` (Celery
beat, every JOB_REAPER_INTERVAL_S) requeues a supervised job whose beat is older than
JOB_HEARTBEAT_TIMEOUT_S, and the new supervisor resumes it from its newest checkpoint.
Broker loss: `reap` also sends `run_job` again for a job queued while the broker was down.
"""

from __future__ import annotations

import logging
import os
import socket

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.dispatch import RUN_JOB, dispatch, send_run_job
from jobs.launch import checkpoint_folder, run_dir
from jobs.models import SUPERVISED, Cause, IllegalTransition, Job, State
from jobs.supervisor import Supervisor, supervise

# imported from here by the API and the tests
__all__ = ["run_job", "reap", "dispatch", "Supervisor", "checkpoint_folder", "run_dir"]

log = logging.getLogger(__name__)


@shared_task(bind=True, name=RUN_JOB)
def run_job(self, job_id: int) -> str:
    """Supervise job `job_id` from launch to its final state (or its pause); returns the state."""
    job = Job.objects.get(pk=job_id)
    if job.state in SUPERVISED and not _take_over(job):
        return job.state
    job.refresh_from_db()
    if job.state != State.QUEUED:
        return job.state  # cancelled while it waited in the queue
    me = f"{socket.gethostname()}/{os.getpid()}/{self.request.id or 'direct'}"
    try:
        job.start(supervisor=me)
    except IllegalTransition:
        return job.state  # another supervisor took it first
    supervise(job, me)
    return job.state


def _take_over(job: Job) -> bool:
    """A redelivered task (its worker died) finds the job still supervised: take it over if
    the old supervisor stopped beating, else leave it to the one that still beats."""
    if not Job.stale(settings.JOB_HEARTBEAT_TIMEOUT_S).filter(pk=job.pk).exists():
        return False
    try:
        job.requeue(Cause.WORKER_LOSS, f"its supervisor ({job.supervisor or 'unknown'}) was "
                    f"lost while the job was {job.state}; resuming from the newest checkpoint")
    except IllegalTransition:
        return False
    return True


@shared_task(name="jobs.tasks.reap")
def reap() -> list[int]:
    """Requeue every supervised job whose supervisor stopped beating, and send `run_job` again
    for every job whose message never reached the broker; returns the ids of both."""
    requeued = []
    for job in Job.undispatched(settings.JOB_REAPER_INTERVAL_S):
        log.warning("job %s: queued at %s but its run_job message was not sent; sending it",
                    job.pk, job.undispatched_since.isoformat())
        send_run_job(job.pk)
        requeued.append(job.pk)
    for job in Job.stale(settings.JOB_HEARTBEAT_TIMEOUT_S):
        beat = job.heartbeat_at.isoformat() if job.heartbeat_at else "never"
        with transaction.atomic():
            try:
                job.requeue(Cause.WORKER_LOSS, f"its supervisor ({job.supervisor or 'unknown'}) "
                            f"stopped beating (last beat {beat}, now "
                            f"{timezone.now().isoformat()}); resuming from the newest checkpoint")
            except IllegalTransition:
                continue  # it moved on meanwhile
            dispatch(job)
        requeued.append(job.pk)
        log.warning("job %s: supervisor lost, requeued", job.pk)
    return requeued
