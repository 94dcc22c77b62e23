"""What the job page shows besides events and states, pushed over the job's websocket when it
changes, so the page never reads it again from the API:

- `command`: one command as GET /commands/ lists it, when it is issued and at every move of its
  state (delivered, done, refused), wherever that happens (API, supervisor, reaper);
- `checkpoints`: the job's newest checkpoints as GET /checkpoints/ lists them (with their ids,
  availability and branch), after a batch of events that saved one or rolled back;
- `settings`: the live settings as GET /settings/ has them, after a batch with a `set` or a
  rollback.

The ingest forwards the last two after the batch's events; monitor.signals pushes `command`.
None is a stored event: each carries `seq`, the newest event the client may already hold, like
the `job` message. A client that was away gets all three again after its replay
(`resync`, with `commands` for the whole list), so it never needs to read them from the API.
"""

from __future__ import annotations

from typing import Any

from engine import contract
from jobs import history
from jobs.models import Checkpoint, Command, Job
from jobs.serializers import CheckpointSerializer, CommandSerializer
from monitor.models import Event

# the checkpoints a message lists, newest: as many as the snapshot's checkpoint events
CHECKPOINTS_LISTED = 500
# the actions that change the live settings (a rollback may restore a checkpoint's)
CHANGES_SETTINGS = frozenset({contract.ActionName.SET, contract.ActionName.ROLLBACK})


def newest_seq(job_id: int) -> int:
    return (Event.objects.filter(job_id=job_id).order_by("-seq")
            .values_list("seq", flat=True).first() or 0)


def command_message(command: Command, seq: int) -> dict[str, Any]:
    return {"type": "command", "seq": seq, "command": CommandSerializer(command).data}


def commands_message(job_id: int, seq: int) -> dict[str, Any]:
    """Every command of the job, oldest first (as GET /commands/ lists them)."""
    rows = Command.objects.filter(job_id=job_id)
    return {"type": "commands", "seq": seq,
            "commands": CommandSerializer(rows, many=True).data}


def checkpoints_message(job_id: int, seq: int) -> dict[str, Any]:
    newest = Checkpoint.objects.filter(job_id=job_id).select_related("export").order_by("-seq")
    rows = list(newest[:CHECKPOINTS_LISTED])[::-1]  # oldest first, as the API lists them
    listed = CheckpointSerializer(rows, many=True,
                                  context={"rollbacks": history.rollbacks(job_id)})
    return {"type": "checkpoints", "seq": seq, "checkpoints": listed.data}


def settings_message(job_id: int, seq: int) -> dict[str, Any]:
    return {"type": "settings", "seq": seq,
            **history.settings_history(Job.objects.get(pk=job_id))}


def resync(job_id: int) -> list[dict[str, Any]]:
    """The commands, checkpoints and settings as they are: what a client (re)connecting needs."""
    seq = newest_seq(job_id)
    return [commands_message(job_id, seq), checkpoints_message(job_id, seq),
            settings_message(job_id, seq)]


def after_batch(job_id: int, events: list[contract.Event], seq: int) -> list[dict[str, Any]]:
    """The messages a stored batch of (parsed) events calls for, to forward after its events."""
    actions = {e.action for e in events if isinstance(e, contract.ActionEvent)}
    messages = []
    # a new checkpoint; a rollback makes the ones past its target the abandoned branch
    if contract.ActionName.ROLLBACK in actions or any(isinstance(e, contract.CheckpointEvent)
                                                      for e in events):
        messages.append(checkpoints_message(job_id, seq))
    if actions & CHANGES_SETTINGS:
        messages.append(settings_message(job_id, seq))
    return messages
