"""The Celery tasks: `schedule` (placement), `run_job` (the supervisor of one job, on its lead
host), `run_part` (a job's engine launcher on each of its other hosts) and `reap` (lost
supervisors, unsent tasks, orphaned slots).

`schedule` places queued jobs on hosts (jobs.placement) and sends each placed job's `run_job`
to its lead host's queue. `run_job` takes the job and supervises one incarnation of its engine
(jobs.supervisor) to its final state or its pause; resuming queues the job again
(jobs.dispatch), and every launch after the first continues from the newest good checkpoint.
On several hosts the lead's supervisor starts a `run_part` on each other host; every part
beats its reservation and watches the others' (jobs.membership), so a lost host, lead or not,
requeues the job onto the survivors.

Worker loss: the task is acknowledged late and handed back if its worker process dies; the
engine gets SIGTERM when its supervisor dies (Linux parent-death signal), so no rank trains
unobserved. While it owns the job the supervisor beats `Job.heartbeat_at`; `reap` (Celery
beat, every JOB_REAPER_INTERVAL_S) requeues a supervised job whose beat is older than
JOB_HEARTBEAT_TIMEOUT_S, and the new supervisor resumes it from its newest checkpoint.
Broker loss: `reap` also schedules, and sends `run_job` again for a placed job whose message
never reached the broker.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

from celery import shared_task
from django.conf import settings
from django.db import OperationalError, transaction
from django.utils import timezone

from engine.runtime.spec import find_latest_good
from hosts.models import Host
from jobs import commands, placement
from jobs.backends import slurm
from jobs.dispatch import RUN_JOB, RUN_PART, SCHEDULE, dispatch, send_run_job
from jobs.launch import checkpoint_folder, kill_group, run_dir, start_engine
from jobs.membership import Peers, held, incarnation_spec, lose_hosts, share
from jobs.models import SUPERVISED, Cause, Command, CommandKind, IllegalTransition, Job, State
from jobs.supervisor import Supervisor, supervise

# imported from here by the API and the tests
__all__ = ["run_job", "run_part", "schedule", "reap", "dispatch", "Supervisor",
           "checkpoint_folder", "run_dir"]

log = logging.getLogger(__name__)

# a start the database refused (a deadlock, a dropped connection, an outage), tried again ever
# later: no other message will come for the placed job, so this one is never given up
START_RETRY_S, START_RETRY_MAX_S = 1.0, 30.0


@shared_task(name=SCHEDULE)
def schedule() -> list[int]:
    """Place what fits now and send each placed job's supervisor to its lead host; returns the
    ids of the jobs placed."""
    placed = placement.schedule()
    for job in placed:
        send_run_job(job)
    return [job.pk for job in placed + slurm.place_waiting()]


@shared_task(bind=True, name=RUN_JOB, max_retries=None)  # (a retry's own None: the default)
def run_job(self, job_id: int, incarnation: int | None = None) -> str:
    """Supervise job `job_id` from launch to its final state (or its pause); returns the state.
    `incarnation`: the placement this message was sent for (a stale one is dropped)."""
    me = f"{socket.gethostname()}/{os.getpid()}/{self.request.id or 'direct'}"
    try:
        job = Job.objects.get(pk=job_id)
        if job.state in SUPERVISED and not _take_over(job):
            return job.state
        job.refresh_from_db()
        if job.state != State.QUEUED or incarnation not in (None, job.incarnation):
            return job.state  # cancelled while it waited in the queue, or placed anew since
        job.start(supervisor=me)
    except IllegalTransition:
        return job.state  # another supervisor took it first
    except OperationalError as error:
        # rolled back, or no database: the job is still queued and placed (START_RETRY_S)
        raise self.retry(exc=error, countdown=min(
            START_RETRY_S * 2 ** self.request.retries, START_RETRY_MAX_S)) from error
    supervise(job, me)
    return job.state


@shared_task(name=RUN_PART)
def run_part(job_id: int, incarnation: int, node_rank: int, endpoint: str) -> str:
    """Run this host's engine launcher for one incarnation of a job on several hosts, beating
    its reservation, until the engine exits or the incarnation ends (the job finished, was
    requeued, or a peer was lost)."""
    job = Job.objects.get(pk=job_id)
    peers = Peers(job, incarnation, node_rank)
    if not (peers.current() and peers.beat()):
        return "stale"
    hosts_now = len(held(job, incarnation))
    proc = start_engine(job, incarnation_spec(job, hosts_now),
                        share(job, incarnation, node_rank, endpoint))
    log.info("job %s: part %s of incarnation %s started, pid %s", job_id, node_rank,
             incarnation, proc.pid)
    try:
        # watched to the incarnation's end, not the engine's: ranks that fail because the
        # lead's host (and the rendezvous store) went down leave this part to say it was lost
        while True:
            time.sleep(settings.PART_BEAT_S)
            lost = peers.silent()
            if not (peers.beat() and peers.current()) or (lost and lose_hosts(
                    job, incarnation, lost, f"host(s) {', '.join(lost)} stopped beating")):
                break
    finally:
        if proc.poll() is None:
            kill_group(proc, signal.SIGKILL)
        proc.wait()
    return f"exit {proc.returncode}"


def _take_over(job: Job) -> bool:
    """A redelivered task (its worker died) finds the job still supervised: take it over if
    the old supervisor stopped beating, else leave it to the one that still beats."""
    if not Job.stale(settings.JOB_HEARTBEAT_TIMEOUT_S).filter(pk=job.pk).exists():
        return False
    if _stays_paused(job, f"its supervisor ({job.supervisor or 'unknown'}) was lost"):
        return False
    try:
        job.requeue(Cause.WORKER_LOSS, f"its supervisor ({job.supervisor or 'unknown'}) was "
                    f"lost while the job was {job.state}; resuming from the newest checkpoint")
    except IllegalTransition:
        return False
    commands.close(job)
    return True


def _stays_paused(job: Job, lost: str) -> bool:
    """A job paused warm (or pausing at a person's or the policy's word) whose supervisor was
    lost: it was paused for a person, so it stays paused, cold now (the ranks' memory is gone
    with the worker) at its newest checkpoint, rather than train on; whether it was one. A
    pause to move the job (the scheduler's regroup) is no such pause: that job is requeued."""
    pause = Command.open_for(job).filter(kind=CommandKind.PAUSE).last()
    if job.state != State.PAUSED_WARM and not (
            job.state == State.PAUSING and pause is not None and pause.cause != Cause.SCHEDULER):
        return False
    message = (f"{lost} while {job.state}: the ranks' memory is gone; paused at "
               f"{_newest_checkpoint(job)}, where resume continues")
    try:
        job.transition(State.PAUSED, Cause.WORKER_LOSS, message=message,
                       expect=frozenset({State.PAUSED_WARM, State.PAUSING}))
    except IllegalTransition:
        return False  # resumed or cancelled meanwhile
    if pause is not None:
        pause.settle(True, {"state": State.PAUSED, "reason": message})
    commands.close(job)
    log.warning("job %s: supervisor lost while paused or pausing; paused", job.pk)
    return True


def _newest_checkpoint(job: Job) -> str:
    """The checkpoint a resume of `job` continues from, as its state history says it."""
    newest, _ = find_latest_good(checkpoint_folder(job))
    if newest is not None:
        return f"its newest checkpoint (step {newest.step})"
    return "the checkpoint it was cloned from" if job.resume_from else "no checkpoint (step 0)"


def _supervisor_lost(job: Job) -> bool:
    """The job's supervisor stopped beating: requeue it to resume from its newest checkpoint
    (unless it `_stays_paused`); whether it was requeued."""
    beat = job.heartbeat_at.isoformat() if job.heartbeat_at else "never"
    lost = (f"its supervisor ({job.supervisor or 'unknown'}) stopped beating (last beat {beat}, "
            f"now {timezone.now().isoformat()})")
    with transaction.atomic():
        # its lead host is passed over until it beats again: a live host does within
        # HOST_BEAT_S, a lost one never, so the job is not placed back onto it
        Host.objects.filter(reservations__in=job.placement[:1]).update(lost_at=timezone.now())
        if _stays_paused(job, lost):
            return False
        try:
            job.requeue(Cause.WORKER_LOSS, f"{lost}; resuming from the newest checkpoint")
        except IllegalTransition:
            return False  # it moved on meanwhile
        commands.close(job)
        dispatch(job)
    log.warning("job %s: supervisor lost, requeued", job.pk)
    return True


@shared_task(name="jobs.tasks.reap")
def reap() -> list[int]:
    """Requeue every supervised job whose supervisor stopped beating, release slots no live job
    holds, schedule, and send `run_job` again for every placed job whose message never reached
    the broker; returns the ids of the jobs requeued, placed or sent."""
    requeued = [job.pk for job in Job.stale(settings.JOB_HEARTBEAT_TIMEOUT_S)
                if _supervisor_lost(job)]
    placement.release_orphans()
    requeued += schedule()
    for job in Job.undispatched(settings.JOB_REAPER_INTERVAL_S):  # placed ones, or waiting
        since = job.undispatched_since.isoformat()
        if send_run_job(job):
            log.warning("job %s: placed, but its run_job message (due since %s) had not been "
                        "sent; sent now", job.pk, since)
            requeued.append(job.pk)
    return list(dict.fromkeys(requeued))  # a job requeued and placed in one pass: once
