"""A training job and its lifecycle.

The Job owns its state machine: state only changes through `Job.transition` (and the named
methods built on it), which checks the move against `TRANSITIONS`, locks the row so the API and
the supervisor cannot interleave, and writes a `JobEvent` saying who or what caused it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone


class State(models.TextChoices):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    ROLLING_BACK = "rolling_back"
    RESHARDING = "resharding"
    COMPLETING = "completing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Cause(models.TextChoices):
    USER = "user"  # a person, through the pages (session)
    API_TOKEN = "api_token"  # a script, through the REST API with a token
    POLICY = "policy"  # the platform's fault policy
    WORKER = "worker"  # the supervisor task, acting on the engine's progress
    WORKER_LOSS = "worker_loss"  # the supervisor found its previous incarnation gone
    ENGINE = "engine"  # the engine reported it (its own state events, its exit)


S = State
TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED})
TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.STARTING, S.CANCELLED, S.FAILED}),
    S.STARTING: frozenset({S.RUNNING, S.CANCELLED, S.FAILED, S.COMPLETING}),
    S.RUNNING: frozenset(
        {S.PAUSING, S.ROLLING_BACK, S.RESHARDING, S.COMPLETING, S.CANCELLED, S.FAILED}
    ),
    S.PAUSING: frozenset({S.PAUSED, S.CANCELLED, S.FAILED}),
    S.PAUSED: frozenset({S.QUEUED, S.CANCELLED}),
    S.ROLLING_BACK: frozenset({S.RUNNING, S.CANCELLED, S.FAILED}),
    S.RESHARDING: frozenset({S.QUEUED, S.CANCELLED, S.FAILED}),
    S.COMPLETING: frozenset({S.COMPLETED, S.FAILED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}


class IllegalTransition(Exception):
    """A move the state machine does not allow; the API answers it with 409."""

    def __init__(self, job: Job, target: str):
        self.job_id = job.pk
        self.state = job.state
        self.target = target
        super().__init__(f"job {job.pk} is {job.state}; it cannot become {target}")


class Job(models.Model):
    name = models.CharField(max_length=64)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs"
    )
    spec = models.JSONField(help_text="the normalised job spec (engine.runtime.spec)")
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    step = models.PositiveIntegerField(default=0, help_text="last optimizer step reported")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    # A cancel is a request the supervisor carries out (it owns the engine's processes).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_cause = models.CharField(max_length=16, choices=Cause.choices, blank=True)
    cancel_actor = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["owner", "-created_at"]), models.Index(fields=["state"])]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name} ({self.state})"

    @property
    def total_steps(self) -> int:
        return int(self.spec.get("train", {}).get("steps", 0))

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL

    def transition(self, target: str, cause: str, actor: str = "", message: str = "") -> JobEvent:
        """Move to `target` (re-read under a row lock) or raise IllegalTransition."""
        with transaction.atomic():
            current = Job.objects.select_for_update().get(pk=self.pk)
            if target not in TRANSITIONS[current.state]:
                self.refresh_from_db()
                raise IllegalTransition(current, target)
            now = timezone.now()
            previous, current.state = current.state, target
            if target == S.STARTING and current.started_at is None:
                current.started_at = now
            if target in TERMINAL:
                current.finished_at = now
            if target == S.FAILED and message:
                current.error = message
            current.save(update_fields=["state", "started_at", "finished_at", "error"])
            event = JobEvent.objects.create(
                job=current, from_state=previous, to_state=target,
                cause=cause, actor=actor, message=message,
            )
        self.refresh_from_db()
        return event

    # The named moves of the foundation; pause, rollback and reshard come with their commands.
    def start(self) -> JobEvent:
        return self.transition(S.STARTING, Cause.WORKER, message="supervisor launching the engine")

    def mark_running(self) -> JobEvent:
        return self.transition(S.RUNNING, Cause.ENGINE, message="the engine reported running")

    def begin_completing(self) -> JobEvent:
        return self.transition(S.COMPLETING, Cause.ENGINE, message="the engine finished training")

    def complete(self) -> JobEvent:
        return self.transition(S.COMPLETED, Cause.WORKER, message="the engine exited cleanly")

    def fail(self, error: str, cause: str = Cause.ENGINE) -> JobEvent:
        return self.transition(S.FAILED, cause, message=error)

    def request_cancel(self, cause: str, actor: str) -> None:
        """Record a cancel; a queued job is cancelled at once, a live one by its supervisor."""
        with transaction.atomic():
            current = Job.objects.select_for_update().get(pk=self.pk)
            if S.CANCELLED not in TRANSITIONS[current.state]:
                self.refresh_from_db()
                raise IllegalTransition(current, S.CANCELLED)
            if current.cancel_requested_at is None:
                Job.objects.filter(pk=self.pk).update(
                    cancel_requested_at=timezone.now(), cancel_cause=cause, cancel_actor=actor
                )
        self.refresh_from_db()
        if self.state == S.QUEUED:
            self.transition(S.CANCELLED, cause, actor, "cancelled before it started")

    def finish_cancel(self, message: str) -> JobEvent:
        """The supervisor stopped the engine on request; the event carries the requester."""
        return self.transition(
            S.CANCELLED, self.cancel_cause or Cause.USER, self.cancel_actor, message
        )


class JobEvent(models.Model):
    """One state transition: the job's audit trail."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=16, choices=State.choices)
    to_state = models.CharField(max_length=16, choices=State.choices)
    cause = models.CharField(max_length=16, choices=Cause.choices)
    actor = models.CharField(max_length=150, blank=True)
    message = models.TextField(blank=True)
    time = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["time", "id"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.from_state} -> {self.to_state} ({self.cause})"
