"""Steering a job: a command is stored, the state move it implies is made, and it is put on
the engine's control stream once the transaction commits; the supervisor settles it when the
engine's `action` event names it (jobs.tasks).

Resume is the platform's own (the job is queued again and its next launch continues from the
newest checkpoint); a cancel of a job no supervisor owns (queued, paused) is done at once.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from engine.runtime import control
from engine.runtime.events import bus_unreachable
from jobs.models import (
    AuditEntry,
    Command,
    CommandKind,
    CommandState,
    IllegalTransition,
    Job,
    State,
)
from jobs.policy import PlatformPolicy

log = logging.getLogger(__name__)

K = CommandKind


def audit(action: str, actor: str, cause: str, *, job: Job | None = None, user=None,
          **details: Any) -> AuditEntry:
    return AuditEntry.objects.create(action=action, actor=actor, cause=cause, job=job,
                                     user=user if job is None else job.owner, details=details)


def _deliver(command: Command) -> None:
    """Put the command on its job's control stream. While the bus is unreachable it stays
    pending, and the job's supervisor delivers it later (`deliver_pending`)."""
    try:
        control.send(str(command.job_id), command.kind, command.engine_args,
                     bus_url=settings.REDIS_URL, command_id=command.engine_id)
    except Exception as error:
        if not bus_unreachable(error):
            raise
        log.warning("%s: the bus is unreachable (%s); it is delivered when the bus is back",
                    command, error)
        return
    command.mark_delivered()


def deliver_pending(job: Job, since: datetime, older_than: datetime) -> None:
    """Deliver, in order, the job's commands that were issued since `since` and are still
    pending at `older_than` (their delivery found the bus away; a resume is never pending: it
    is settled when issued). The engine ignores a command id it has seen, so one delivered
    twice acts once."""
    for command in Command.objects.filter(job=job, state=CommandState.PENDING,
                                          created_at__gte=since, created_at__lt=older_than):
        _deliver(command)


def issue(job: Job, kind: str, args: dict[str, Any], *, actor: str, cause: str,
          engine_args: dict[str, Any] | None = None) -> Command:
    """Store and carry out (or hand to the engine) one command; IllegalTransition when the
    job's state does not allow it. `engine_args` are the args as the engine takes them (a
    checkpoint by path rather than by id), default `args`."""
    from jobs.tasks import dispatch

    with transaction.atomic():
        command = Command.objects.create(
            job=job, kind=kind, args=args, requested_by=actor, cause=cause,
            engine_args=args if engine_args is None else engine_args)
        deliver = True
        if kind == K.PAUSE:
            job.request_pause(cause, actor)
        elif kind == K.ROLLBACK:
            target = (f"checkpoint {args['checkpoint']}" if "checkpoint" in args
                      else f"step {args['step']}")
            job.begin_rollback(cause, actor, f"rollback to {target} requested")
        elif kind == K.RESHARD:
            layout = f"{args['strategy']} on {args['nodes']}x{args['procs_per_node']}"
            job.begin_reshard(cause, actor, f"reshard onto {layout} requested")
        elif kind == K.CHECKPOINT:
            job.refresh_from_db(fields=["state"])
            if job.state != State.RUNNING:
                raise IllegalTransition(job, job.state, "a checkpoint needs a running job")
        elif kind == K.RESUME:
            job.request_resume(cause, actor)
            command.settle(True, {"state": State.QUEUED})
            dispatch(job)
            deliver = False
        elif kind == K.CANCEL:
            job.request_cancel(cause, actor)
            if job.state == State.CANCELLED:
                command.settle(True, {"state": State.CANCELLED})
            # only a running engine reads its control stream; before that (starting) the
            # supervisor stops it with a signal
            deliver = job.state == State.RUNNING
        audit(f"job.{kind}", actor, cause, job=job, command=command.pk, args=args)
        if deliver:
            transaction.on_commit(lambda: _deliver(command))
    command.refresh_from_db()
    return command


def policy_of(job: Job) -> PlatformPolicy:
    return PlatformPolicy.parse(job.platform or None)
