"""A command's whole life: issued (stored, with the state move it implies: COMMAND_RULES),
delivered to the engine's control stream once the transaction commits (or later, by the job's
supervisor, if the bus was away), settled when the engine's `action` event names it, and closed
unanswered when the run ends first.

Resume is the platform's own (the job is queued again and its next launch continues from the
newest checkpoint), except after a warm pause: its engine idles in memory and goes on when the
resume reaches it (the job runs again on the engine's `running` state event). A cancel of a
job no supervisor owns (queued, paused) is done at once, and of a live one carried out by its
supervisor (jobs.supervisor).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import redis
from django.conf import settings
from django.db import transaction

from engine import contract
from engine.runtime.events import bus_unreachable
from jobs.backends.slurm import resubmits
from jobs.dispatch import dispatch
from jobs.models import STEERED, AuditEntry, Command, CommandKind, CommandState, Job, State

log = logging.getLogger(__name__)

# the states in which the engine reads its control stream
ENGINE_READS = frozenset({State.RUNNING, State.PAUSED_WARM})


def issue(job: Job, kind: str, args: dict[str, Any], *, actor: str, cause: str,
          engine_args: dict[str, Any] | None = None) -> Command:
    """Store and carry out (or hand to the engine) one command; IllegalTransition when the
    job's state does not allow it. `engine_args` are the args as the engine takes them (a
    checkpoint by path rather than by id), default `args`."""
    with transaction.atomic():
        command = Command.objects.create(
            job=job, kind=kind, args=args, requested_by=actor, cause=cause,
            engine_args=args if engine_args is None else engine_args)
        if kind == CommandKind.CANCEL:
            job.request_cancel(cause, actor)
            if job.state == State.CANCELLED:
                command.settle(True, {"state": State.CANCELLED})
            # only a running engine reads its control stream; before that (starting) the
            # supervisor stops it with a signal
            delivered = job.state in ENGINE_READS
        elif kind == CommandKind.RESUME and _paused_warm(job):
            delivered = True  # the engine goes on from memory; the job runs on its word
        else:
            job.steer(kind, cause, actor, _requested(kind, args))
            delivered = kind != CommandKind.RESUME
        if kind == CommandKind.RESUME and not delivered:
            command.settle(True, {"state": State.QUEUED})
            dispatch(job)
        AuditEntry.record(f"job.{kind}", actor, cause, job=job, command=command.pk, args=args)
        if delivered:
            transaction.on_commit(lambda: deliver(command))
    command.refresh_from_db()
    return command


def _paused_warm(job: Job) -> bool:
    job.refresh_from_db(fields=["state"])
    return job.state == State.PAUSED_WARM


def _requested(kind: str, args: dict[str, Any]) -> str:
    """The state history's note of a command's move."""
    if kind == CommandKind.ROLLBACK:
        target = (f"checkpoint {args['checkpoint']}" if "checkpoint" in args
                  else f"step {args['step']}")
        return f"rollback to {target} requested"
    if kind == CommandKind.RESHARD:
        layout = f"{args['strategy']} on {args['nodes']}x{args['procs_per_node']}"
        return f"reshard onto {layout} requested"
    if kind == CommandKind.RESUME:
        return "resume requested: queued to continue from its newest checkpoint"
    if args.get("reason"):  # the platform's own pauses say why
        return f"{kind} requested: {args['reason']}"
    return f"{kind} requested"


def deliver(command: Command) -> None:
    """Put the command on its job's control stream. While the bus is unreachable it stays
    pending, and the job's supervisor delivers it later (`deliver_pending`)."""
    wire = as_sent(command)
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.xadd(contract.control_stream(str(command.job_id)),
                    {"command": json.dumps(wire.to_dict())})
    except Exception as error:
        if not bus_unreachable(error):
            raise
        log.warning("%s: the bus is unreachable (%s); it is delivered when the bus is back",
                    command, error)
        return
    finally:
        client.close()
    command.mark_delivered()


def as_sent(command: Command) -> contract.Command:
    """The command as the engine gets it: a reshard onto another number of Slurm nodes is a
    cold pause (an allocation cannot change size: jobs.backends.slurm_run submits the job
    again at the new size from the checkpoint the pause writes)."""
    if command.kind == CommandKind.RESHARD and resubmits(command.job, command.args):
        return contract.Command(contract.CommandKind.PAUSE, {}, command.engine_id)
    return contract.Command(contract.CommandKind(command.kind), command.engine_args,
                            command.engine_id)


def deliver_pending(job: Job, since: datetime, older_than: datetime) -> None:
    """Deliver, in order, the job's commands that were issued since `since` and are still
    pending at `older_than` (their delivery found the bus away; a resume is never pending: it
    is settled when issued). The engine ignores a command id it has seen, so one delivered
    twice acts once."""
    for command in Command.objects.filter(job=job, state=CommandState.PENDING,
                                          created_at__gte=since, created_at__lt=older_than):
        deliver(command)


def redeliver(job: Job) -> list[Command]:
    """The engine restarted its ranks (a crash, its policy's restart, a reshard): the new rank 0
    reads its control stream from where it began, so a command delivered to the ranks before
    and never answered (their answer would have come first) is lost unless delivered again.
    Each is carried out by the new ranks or refused with their reason; returns them."""
    lost = list(Command.objects.filter(job=job, state=CommandState.DELIVERED))
    for command in lost:
        log.info("%s: the engine restarted its ranks before answering it; delivered again",
                 command)
        deliver(command)
    return lost


def settle(job: Job, event: contract.ActionEvent) -> None:
    """The engine answered the command `event.command` names (a platform command's id, digits):
    record the answer, and move the
    job on from the state the command put it in where the answer ends that state (a refusal;
    a rollback done in-process). A pause ends with the engine's exit, a reshard with its
    `running` state event (jobs.supervisor)."""
    command = Command.objects.filter(job=job, pk=int(event.command)).first()
    unstamped = (contract.Header.TYPE, contract.Header.JOB, contract.Header.TIME)
    answer = {k: v for k, v in event.to_dict().items() if k not in unstamped}
    if command is None or not command.settle(not event.refused, answer):
        return
    job.refresh_from_db(fields=["state"])
    if job.state not in STEERED or job.state != contract.COMMAND_RULES[command.kind].moves_to:
        return
    if event.refused:
        job.back_to_running(f"{command.kind} refused by the engine: {event.error}")
    elif command.kind == CommandKind.ROLLBACK:
        job.back_to_running(f"rolled back from step {event.details.get('from_step')} to step "
                            f"{event.details.get('to_step')} ({event.details.get('checkpoint')})")


def close(job: Job) -> None:
    """The run ended: the commands the engine never answered are refused with that reason;
    but a cancel of a run that ended cancelled was carried out, if by the supervisor's signal
    rather than by the engine."""
    job.refresh_from_db(fields=["state"])
    for command in Command.open_for(job):
        if command.kind == CommandKind.CANCEL and job.state == State.CANCELLED:
            command.settle(True, {"state": State.CANCELLED})
        else:
            command.settle(False, {"error": f"the run ended ({job.state}) before the engine "
                                            "acted on it"})
