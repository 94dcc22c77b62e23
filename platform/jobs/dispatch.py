"""Queueing the work of a job so that a broker outage loses no job.

`dispatch` marks the queued job undispatched in the caller's transaction and, after the commit,
asks for a scheduling pass (`jobs.tasks.schedule`, on the shared queue): placement reserves the
job's hosts (jobs.placement) and `send_run_job` sends its supervisor task to the queue of its
lead host (`host.<name>`), which clears the mark. A send that fails (the broker is down) leaves
the mark for the reaper, which schedules and sends again. A duplicate message is harmless: a
second `run_job` finds the job no longer queued, or on another incarnation.
"""

from __future__ import annotations

import logging

from celery import current_app
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from jobs.models import Job, Reservation

log = logging.getLogger(__name__)

# sent by name: jobs.tasks defines the tasks and dispatches through this module
RUN_JOB = "jobs.tasks.run_job"
RUN_PART = "jobs.tasks.run_part"
SCHEDULE = "jobs.tasks.schedule"


def dispatch(job: Job) -> None:
    """Ask for `job` (queued) to be placed once the current transaction commits. Call it inside
    that transaction: the job is marked undispatched with it, so a message that cannot be sent
    (the broker is down) is sent again by `reap` rather than lost."""
    Job.objects.filter(pk=job.pk).update(undispatched_since=timezone.now())
    transaction.on_commit(send_schedule)


def send_schedule() -> None:
    """Ask a worker for a scheduling pass (placement runs in a worker, not in a web request)."""
    try:
        current_app.send_task(SCHEDULE)
    except OperationalError as e:
        log.warning("a scheduling pass could not be queued (%s); the reaper schedules", e)


def send_run_job(job: Job) -> bool:
    """Send the placed job's supervisor task to its lead host; on success the job is no longer
    undispatched. Whether it was sent (not when the job holds no placement: not placed yet, or
    released meanwhile)."""
    lead = (Reservation.objects.filter(job=job, incarnation=job.incarnation, node_rank=0,
                                       released_at=None).select_related("host").first())
    if lead is None:
        return False
    try:
        current_app.send_task(RUN_JOB, args=[job.pk, job.incarnation], queue=lead.host.queue)
    except OperationalError as e:
        log.warning("job %s: run_job could not be queued (%s); the reaper sends it again",
                    job.pk, e)
        return False
    Job.objects.filter(pk=job.pk).update(undispatched_since=None)
    return True


def send_run_part(job: Job, reservation: Reservation, endpoint: str) -> None:
    """Start one non-lead host's part of the job's incarnation (its engine launcher); a part
    that never starts is found by its peers (jobs.membership) and the job placed anew."""
    try:
        current_app.send_task(RUN_PART,
                              args=[job.pk, job.incarnation, reservation.node_rank, endpoint],
                              queue=reservation.host.queue)
    except OperationalError as e:
        log.warning("job %s: the part for host %s could not be queued (%s)", job.pk,
                    reservation.host.name, e)
