"""A `Command`: one control request (pause, rollback, ...), stored, delivered to the running
engine's control stream, and settled (done or refused, with the engine's answer) when the
engine's `action` event naming its id arrives (jobs.commands)."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone

from jobs.models.job import Cause, CommandKind, Job
from jobs.signals import command_changed


class CommandState(models.TextChoices):
    PENDING = "pending"  # stored, not yet on the engine's control stream
    DELIVERED = "delivered"  # on the control stream; the engine acts at its next step boundary
    DONE = "done"
    REFUSED = "refused"


class Command(models.Model):
    """One control request; `id` is the command id the engine's `action` event names."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="commands")
    kind = models.CharField(max_length=16, choices=CommandKind.choices)
    args = models.JSONField(default=dict, blank=True)
    engine_args = models.JSONField(default=dict, blank=True,
                                   help_text="the args as the engine takes them (a checkpoint "
                                   "by its path rather than its id)")
    state = models.CharField(max_length=16, choices=CommandState.choices,
                             default=CommandState.PENDING)
    result = models.JSONField(default=dict, blank=True,
                              help_text="the engine's answer (its action event) or the reason "
                              "it was refused")
    requested_by = models.CharField(max_length=150, blank=True)
    cause = models.CharField(max_length=16, choices=Cause.choices)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["job", "state"])]

    def __str__(self) -> str:
        return f"command {self.pk} {self.kind} for job {self.job_id} ({self.state})"

    @property
    def engine_id(self) -> str:
        """The id the engine acknowledges (`action.command`)."""
        return str(self.pk)

    def mark_delivered(self) -> None:
        moved = Command.objects.filter(pk=self.pk, state=CommandState.PENDING).update(
            state=CommandState.DELIVERED, updated_at=timezone.now())
        self.refresh_from_db()
        if moved:
            command_changed.send(sender=Command, command=self)

    def settle(self, done: bool, result: dict[str, Any]) -> bool:
        """Record the outcome once; False if it was already settled."""
        open_states = (CommandState.PENDING, CommandState.DELIVERED)
        settled = Command.objects.filter(pk=self.pk, state__in=open_states).update(
            state=CommandState.DONE if done else CommandState.REFUSED, result=result,
            updated_at=timezone.now())
        self.refresh_from_db()
        if settled:
            command_changed.send(sender=Command, command=self)
        return bool(settled)

    @classmethod
    def open_for(cls, job: Job) -> models.QuerySet[Command]:
        return cls.objects.filter(job=job, state__in=(CommandState.PENDING,
                                                      CommandState.DELIVERED))
