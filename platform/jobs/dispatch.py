"""Queueing a job's supervisor task (`jobs.tasks.run_job`) so that a broker outage loses no job.

`dispatch` marks the job undispatched in the caller's transaction and sends the task after the
commit; a send that fails (the broker is down) leaves the mark for the reaper to send it again.
A duplicate message is harmless: the second `run_job` finds the job no longer queued.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from jobs.models import Job
from ringside.celery import app

log = logging.getLogger(__name__)

# sent by name: jobs.tasks defines the task and dispatches through this module
RUN_JOB = "jobs.tasks.run_job"


def dispatch(job: Job) -> None:
    """Queue `run_job` for the queued `job` once the current transaction commits. Call it
    inside that transaction: the job is marked undispatched with it, so a message that cannot
    be sent (the broker is down) is sent again by `reap` rather than lost."""
    Job.objects.filter(pk=job.pk).update(undispatched_since=timezone.now())
    transaction.on_commit(lambda pk=job.pk: send_run_job(pk))


def send_run_job(job_id: int) -> None:
    """Send the task now; on success the job is no longer undispatched."""
    try:
        app.send_task(RUN_JOB, args=[job_id])
    except OperationalError as e:
        log.warning("job %s: run_job could not be queued (%s); the reaper sends it again",
                    job_id, e)
        return
    Job.objects.filter(pk=job_id).update(undispatched_since=None)
