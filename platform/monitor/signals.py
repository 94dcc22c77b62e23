"""Every job state change, wherever it is made (API, supervisor, reaper), is pushed once to
the job's websocket group (with the checkpoint list: a stopped run's memory tier is gone) and to
the list sockets of those who may see the job.

It hangs on the state-history row (`JobEvent`) that `Job.transition` writes, and is sent after
the transaction commits, so a client never hears of a state the database does not hold. This is
the only push of a state change: every transition writes its row. The transition is folded
into the job's goodput ledger in its own transaction, and the ledger is pushed with it.

A command's every change (issued, delivered, settled) is pushed the same way to the job's
socket (monitor.pushes), from `post_save` and the jobs app's `command_changed`.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from jobs.models import Command, JobEvent
from jobs.signals import command_changed
from monitor import goodput, pushes
from monitor.ingest import job_group
from monitor.messages import job_message

log = logging.getLogger(__name__)

STAFF_GROUP = "jobs-staff"


def user_group(user_id: int) -> str:
    """The channel-layer group of one user's list sockets."""
    return f"jobs-user-{user_id}"


@receiver(post_save, sender=JobEvent, dispatch_uid="monitor-push-state")
def push_state_change(sender: type, instance: JobEvent, created: bool, **kwargs: Any) -> None:
    if created:
        goodput.fold_transition(instance)
        transaction.on_commit(lambda: _push(instance))


def _push(row: JobEvent) -> None:
    # on the job socket, seq is the newest event the client may already hold
    last = pushes.newest_seq(row.job_id)
    layer = get_channel_layer()
    # every message read from the database here, not in the event loop below
    on_job_socket = [job_message(row.job, last, row), goodput.message(row.job_id, last),
                     # the memory tier's checkpoints go with the ranks that held them
                     pushes.checkpoints_message(row.job_id, last)]
    listed = {"type": "job.state", "event": job_message(row.job, row.pk, row)}

    async def send() -> None:
        await layer.group_send(job_group(row.job_id), {"type": "job.events",
                                                       "events": on_job_socket})
        await layer.group_send(user_group(row.job.owner_id), listed)
        await layer.group_send(STAFF_GROUP, listed)

    try:
        async_to_sync(send)()
    except Exception:
        # the change is committed; a client that missed the push reads it from its next
        # snapshot, so a channel-layer outage must not fail the caller's state change
        log.exception("job %s: could not push the state change to websockets", row.job_id)


@receiver(post_save, sender=Command, dispatch_uid="monitor-push-command-issued")
def push_command_issued(sender: type, instance: Command, created: bool, **kwargs: Any) -> None:
    if created:
        transaction.on_commit(lambda: _push_command(instance.pk, instance.job_id))


@receiver(command_changed, sender=Command, dispatch_uid="monitor-push-command-moved")
def push_command_moved(sender: type, command: Command, **kwargs: Any) -> None:
    transaction.on_commit(lambda: _push_command(command.pk, command.job_id))


def _push_command(command_id: int, job_id: int) -> None:
    """The command as it is once its change committed (two changes in one transaction push
    the state it ends in twice, which a page takes as once)."""
    message = pushes.command_message(Command.objects.get(pk=command_id),
                                     pushes.newest_seq(job_id))
    try:
        async_to_sync(get_channel_layer().group_send)(
            job_group(job_id), {"type": "job.events", "events": [message]})
    except Exception:
        # committed all the same; a client that missed it gets the list when it reconnects
        log.exception("job %s: could not push command %s to websockets", job_id, command_id)
