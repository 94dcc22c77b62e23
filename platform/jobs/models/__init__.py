"""The jobs app's models, one module per concern: a job and its lifecycle (job), the commands
that steer it (command), its checkpoints and what is made from them (artifacts), and access
to the API (access). Every model is importable from here, as Django and the migrations expect."""

from jobs.models.access import (
    ApiToken,
    AuditEntry,
    IdempotencyKey,
    Limits,
    Quota,
    Webhook,
    _new_key,
    token_digest,
)
from jobs.models.artifacts import Checkpoint, Evaluation, Export, ExportState
from jobs.models.command import Command, CommandState
from jobs.models.job import (
    STEERED,
    SUPERVISED,
    TERMINAL,
    TRANSITIONS,
    UNPLACED,
    Cause,
    CommandKind,
    IllegalTransition,
    Job,
    JobEvent,
    Reservation,
    ReservationQuerySet,
    S,
    State,
)

__all__ = [
    "STEERED", "SUPERVISED", "TERMINAL", "TRANSITIONS", "UNPLACED", "ApiToken", "AuditEntry",
    "Cause", "Checkpoint", "Command", "CommandKind", "CommandState", "Evaluation", "Export",
    "ExportState", "IdempotencyKey", "IllegalTransition", "Job", "JobEvent", "Limits", "Quota",
    "Reservation", "ReservationQuerySet", "S", "State", "Webhook", "_new_key", "token_digest",
]
