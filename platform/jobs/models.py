"""A training job, its lifecycle, the commands that steer it, and who may steer it.

The Job owns its state machine: state only changes through `Job.transition` (and the named
methods built on it), which checks the move against `TRANSITIONS`, locks the row so the API and
the supervisor cannot interleave, and writes a `JobEvent` saying who or what caused it.

A `Command` is one control request (pause, rollback, ...): stored, delivered to the running
engine's control stream, and settled (done or refused, with the engine's answer) when the
engine's `action` event naming its id arrives. `ApiToken`, `IdempotencyKey`, `AuditEntry` and
`Webhook` are the API's named tokens, replayable POSTs, audit trail and signed notifications.
A `Reservation` is one placed host's share of a job: the slots it holds there (jobs.placement).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from engine.contract import COMMAND_RULES, FINAL_STATES, JobState
from engine.contract import CommandKind as EngineCommandKind
from engine.runtime.spec import with_layout

# the engine's job states and command kinds (engine.contract), as model field choices
State = models.TextChoices("State", [(s.name, s.value) for s in JobState])
CommandKind = models.TextChoices("CommandKind", [(k.name, k.value) for k in EngineCommandKind])


class Cause(models.TextChoices):
    USER = "user"  # a person, through the pages (session)
    API_TOKEN = "api_token"  # a script, through the REST API with a token
    POLICY = "policy"  # the platform's fault policy
    WORKER = "worker"  # the supervisor task, acting on the engine's progress
    WORKER_LOSS = "worker_loss"  # the supervisor found its previous incarnation gone
    HOST_LOSS = "host_loss"  # a host the job was placed on stopped beating or was drained
    SCHEDULER = "scheduler"  # placement: the job got its hosts, or waits for them
    ENGINE = "engine"  # the engine reported it (its own state events, its exit)


S = State
TERMINAL = FINAL_STATES
# states in which a supervisor owns the job and beats its heartbeat (a warm pause too: its
# engine idles in memory, holding the worker, until a resume or its limit turns it cold)
SUPERVISED = frozenset({S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED_WARM, S.ROLLING_BACK,
                        S.RESHARDING, S.COMPLETING})
# Every supervised state may go back to QUEUED: the supervisor was lost and the job resumes
# from its newest checkpoint. A refused pause, rollback or reshard goes back to RUNNING, and
# so does a reshard the engine carried out in-process (it relaunches its own ranks).
TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.STARTING, S.WAITING_FOR_HOSTS, S.CANCELLED, S.FAILED}),
    S.STARTING: frozenset({S.RUNNING, S.CANCELLED, S.FAILED, S.COMPLETING, S.QUEUED}),
    S.RUNNING: frozenset(
        {S.PAUSING, S.ROLLING_BACK, S.RESHARDING, S.COMPLETING, S.CANCELLED, S.FAILED, S.QUEUED}
    ),
    S.PAUSING: frozenset({S.PAUSED, S.PAUSED_WARM, S.RUNNING, S.COMPLETING, S.CANCELLED,
                          S.FAILED, S.QUEUED}),
    S.PAUSED: frozenset({S.QUEUED, S.CANCELLED}),
    # lost hosts left fewer than parallel.min_hosts: placed again when capacity returns
    S.WAITING_FOR_HOSTS: frozenset({S.STARTING, S.QUEUED, S.CANCELLED, S.FAILED}),
    S.PAUSED_WARM: frozenset({S.RUNNING, S.PAUSED, S.CANCELLED, S.FAILED, S.QUEUED}),
    S.ROLLING_BACK: frozenset({S.RUNNING, S.COMPLETING, S.CANCELLED, S.FAILED, S.QUEUED}),
    S.RESHARDING: frozenset({S.RUNNING, S.QUEUED, S.COMPLETING, S.CANCELLED, S.FAILED}),
    S.COMPLETING: frozenset({S.COMPLETED, S.FAILED, S.QUEUED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
# the states a running job takes while the engine carries out a command (COMMAND_RULES); it
# runs on when the engine is done with it or refuses it
# states in which a job holds no slots: entering one releases its reservations (a requeued job
# is placed again, perhaps elsewhere; a cold pause frees its hosts; a final job holds nothing)
UNPLACED = frozenset({S.QUEUED, S.PAUSED, S.WAITING_FOR_HOSTS}) | TERMINAL
STEERED = frozenset(rule.moves_to for rule in COMMAND_RULES.values()
                    if rule.moves_to is not None and rule.allowed_in == {S.RUNNING})


class IllegalTransition(Exception):
    """A move the state machine does not allow; the API answers it with 409."""

    def __init__(self, job: Job, target: str, wanted: str = ""):
        self.job_id = job.pk
        self.state = job.state
        self.target = target
        super().__init__(f"job {job.pk} is {job.state}; "
                         + (wanted or f"it cannot become {target}"))


class Job(models.Model):
    name = models.CharField(max_length=64)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs"
    )
    spec = models.JSONField(help_text="the normalised job spec (engine.runtime.spec)")
    state = models.CharField(max_length=24, choices=State.choices, default=State.QUEUED)
    step = models.PositiveIntegerField(default=0, help_text="last optimizer step reported")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    # A cancel is a request the supervisor carries out (it owns the engine's processes).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_cause = models.CharField(max_length=16, choices=Cause.choices, blank=True)
    cancel_actor = models.CharField(max_length=150, blank=True)
    # The supervisor beats while it owns the job; the reaper requeues a job whose beat stopped.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    supervisor = models.CharField(max_length=200, blank=True,
                                  help_text="the Celery task that supervises the job now")
    launches = models.PositiveIntegerField(default=0, help_text="engine launches so far")
    # Set when the job is queued, cleared once its run_job task reached the broker; a job
    # queued while the broker was down keeps it, and the reaper sends the task again.
    undispatched_since = models.DateTimeField(null=True, blank=True)
    resume_from = models.CharField(
        max_length=1024, blank=True,
        help_text="a checkpoint the first launch starts from (a clone of another job's)")
    platform = models.JSONField(default=dict, blank=True,
                                help_text="the platform's fault policy for this job "
                                "(jobs.policy.PlatformPolicy)")
    tags = models.JSONField(default=list, blank=True,
                            help_text="the owner's labels (jobs.serializers.JobNoteSerializer)")
    note = models.TextField(blank=True, help_text="the owner's free-text note")
    priority = models.IntegerField(default=0, help_text="placement order: higher first "
                                   "(jobs.placement; -100..100)")
    incarnation = models.PositiveIntegerField(
        default=0, help_text="placements so far; its reservations carry the one they belong to")
    waiting_reason = models.TextField(blank=True, help_text="why placement could not place it "
                                      "yet; empty once placed")
    backend = models.CharField(max_length=16, default="hosts", help_text=(
        "what places and launches it (jobs.backends): Ringside's own hosts, or Slurm"))
    backend_options = models.JSONField(default=dict, blank=True, help_text=(
        "the backend's own options, e.g. Slurm's partition, account, time_limit"))
    backend_ref = models.CharField(max_length=64, blank=True, help_text=(
        "the backend's name for the current incarnation (a Slurm job id)"))

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

    def transition(self, target: str, cause: str, actor: str = "", message: str = "",
                   expect: frozenset[str] | None = None) -> JobEvent:
        """Move to `target` (re-read under a row lock) or raise IllegalTransition; with
        `expect`, only from one of those states (a move meant for the state it had when the
        caller looked, not for whatever it became since). Entering a state that holds no slots
        (UNPLACED) releases the job's reservations in the same transaction."""
        with transaction.atomic():
            current = Job.objects.select_for_update().get(pk=self.pk)
            allowed = target in TRANSITIONS[current.state]
            if not allowed or (expect is not None and current.state not in expect):
                self.refresh_from_db()
                raise IllegalTransition(current, target)
            now = timezone.now()
            previous, current.state = current.state, target
            if target == S.STARTING:
                current.launches += 1
                current.heartbeat_at = now
                if current.started_at is None:
                    current.started_at = now
            if target in TERMINAL:
                current.finished_at = now
            if target == S.FAILED and message:
                current.error = message
            if target == S.QUEUED:  # a new supervisor takes over
                current.supervisor, current.heartbeat_at = "", None
            if target in UNPLACED:
                Reservation.objects.held().filter(job=current).update(released_at=now)
            current.save(update_fields=["state", "started_at", "finished_at", "error",
                                        "launches", "heartbeat_at", "supervisor"])
            # at the time the job's own timestamps take: its goodput ledger ends there
            event = JobEvent.objects.create(
                job=current, from_state=previous, to_state=target,
                cause=cause, actor=actor, message=message, time=now,
            )
        self.refresh_from_db()
        return event

    @property
    def placement(self) -> list[Reservation]:
        """Where the job is placed now: its held reservations, by node rank (0: the lead host,
        which holds the rendezvous endpoint and supervises); empty when it is not placed.
        Read through `reservations.all()` so that a list's prefetch serves every job."""
        return sorted((r for r in self.reservations.all()
                       if r.released_at is None and r.incarnation == self.incarnation),
                      key=lambda r: r.node_rank)

    # -- the named moves ----------------------------------------------------------------
    def start(self, supervisor: str = "") -> JobEvent:
        """A supervisor takes the queued job (only one can: the move is made under a lock)."""
        event = self.transition(S.STARTING, Cause.WORKER, message="supervisor launching the engine")
        if supervisor:
            Job.objects.filter(pk=self.pk).update(supervisor=supervisor)
            self.supervisor = supervisor
        return event

    def wait_for_hosts(self, reason: str) -> JobEvent:
        """A job that has run cannot get even parallel.min_hosts hosts: it waits for capacity
        rather than failing (placement moves it back to queued once it is placed again)."""
        return self.transition(S.WAITING_FOR_HOSTS, Cause.SCHEDULER, message=reason,
                               expect=frozenset({S.QUEUED}))

    def mark_running(self) -> JobEvent:
        return self.transition(S.RUNNING, Cause.ENGINE, message="the engine reported running")

    def begin_completing(self) -> JobEvent:
        return self.transition(S.COMPLETING, Cause.ENGINE, message="the engine finished training")

    def complete(self) -> JobEvent:
        return self.transition(S.COMPLETED, Cause.WORKER, message="the engine exited cleanly")

    def fail(self, error: str, cause: str = Cause.ENGINE) -> JobEvent:
        return self.transition(S.FAILED, cause, message=error)

    def steer(self, kind: str, cause: str, actor: str, message: str) -> JobEvent | None:
        """Make the move a command implies (COMMAND_RULES), or only check that the job's
        state allows it (a checkpoint); IllegalTransition otherwise."""
        rule = COMMAND_RULES[EngineCommandKind(kind)]
        if rule.moves_to is None:
            self.refresh_from_db(fields=["state"])
            if self.state not in rule.allowed_in:
                raise IllegalTransition(self, self.state, f"a {kind} needs a "
                                        f"{' or '.join(sorted(rule.allowed_in))} job")
            return None
        return self.transition(rule.moves_to, cause, actor, message, expect=rule.allowed_in)

    def request_pause(self, cause: str, actor: str) -> JobEvent:
        return self.steer(CommandKind.PAUSE, cause, actor, "pause requested")

    def mark_paused(self, message: str) -> JobEvent:
        return self.transition(S.PAUSED, Cause.ENGINE, message=message)

    def mark_paused_warm(self, message: str) -> JobEvent:
        return self.transition(S.PAUSED_WARM, Cause.ENGINE, message=message,
                               expect=frozenset({S.PAUSING}))

    def resumed_warm(self) -> JobEvent:
        return self.transition(S.RUNNING, Cause.ENGINE, message="resumed warm: the ranks went "
                               "on from memory", expect=frozenset({S.PAUSED_WARM}))

    def back_to_running(self, message: str) -> JobEvent:
        """A rollback or reshard is done (or a steering command was refused)."""
        return self.transition(S.RUNNING, Cause.ENGINE, message=message, expect=STEERED)

    def adopt_layout(self, parallel: dict[str, Any], micro_batch: int) -> None:
        """The engine resharded onto `parallel`: later launches (a resume) use that layout."""
        with transaction.atomic():
            current = Job.objects.select_for_update().get(pk=self.pk)
            spec = with_layout(current.spec, parallel, micro_batch)
            Job.objects.filter(pk=self.pk).update(spec=spec)
        self.refresh_from_db(fields=["spec"])

    def requeue(self, cause: str, message: str, actor: str = "") -> JobEvent:
        """Its supervisor is gone (or the policy resumes a crashed run): queue it again to
        continue from its newest checkpoint."""
        return self.transition(S.QUEUED, cause, actor, message, expect=SUPERVISED)

    def beat(self, supervisor: str) -> bool:
        """The supervisor's heartbeat; False when the job is no longer this supervisor's
        (the reaper gave it to another one)."""
        return bool(Job.objects.filter(pk=self.pk, supervisor=supervisor, state__in=SUPERVISED)
                    .update(heartbeat_at=timezone.now()))

    @classmethod
    def undispatched(cls, grace_s: float) -> models.QuerySet[Job]:
        """Queued jobs whose run_job task has not reached the broker for `grace_s` seconds."""
        cutoff = timezone.now() - timedelta(seconds=grace_s)
        return cls.objects.filter(state=S.QUEUED, undispatched_since__lt=cutoff)

    @classmethod
    def stale(cls, timeout_s: float) -> models.QuerySet[Job]:
        """Supervised jobs whose supervisor has not beaten for `timeout_s` seconds."""
        cutoff = timezone.now() - timedelta(seconds=timeout_s)
        return cls.objects.filter(state__in=SUPERVISED).filter(
            models.Q(heartbeat_at__lt=cutoff) | models.Q(heartbeat_at__isnull=True))

    def request_cancel(self, cause: str, actor: str) -> None:
        """Record a cancel; a queued, paused or waiting_for_hosts job is cancelled at once (no
        supervisor owns it), a live one by its supervisor."""
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
        unsupervised = frozenset({S.QUEUED, S.PAUSED, S.WAITING_FOR_HOSTS})
        if self.state in unsupervised:
            try:
                self.transition(S.CANCELLED, cause, actor, f"cancelled while {self.state}",
                                expect=unsupervised)
            except IllegalTransition:
                pass  # a supervisor took it meanwhile; it carries the recorded request out

    def finish_cancel(self, message: str) -> JobEvent:
        """The supervisor stopped the engine on request; the event carries the requester."""
        return self.transition(
            S.CANCELLED, self.cancel_cause or Cause.USER, self.cancel_actor, message
        )


class JobEvent(models.Model):
    """One state transition: the job's audit trail."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=24, choices=State.choices)
    to_state = models.CharField(max_length=24, choices=State.choices)
    cause = models.CharField(max_length=16, choices=Cause.choices)
    actor = models.CharField(max_length=150, blank=True)
    message = models.TextField(blank=True)
    time = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["time", "id"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.from_state} -> {self.to_state} ({self.cause})"


class ReservationQuerySet(models.QuerySet):
    def held(self) -> ReservationQuerySet:
        return self.filter(released_at__isnull=True)


class Reservation(models.Model):
    """One placed host's share of a job's incarnation: the slot indices it holds there. Held
    while `released_at` is null; a slot index is held by at most one held reservation of its
    host (jobs.placement takes them under a lock on the host rows)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="reservations")
    host = models.ForeignKey("hosts.Host", on_delete=models.CASCADE, related_name="reservations")
    incarnation = models.PositiveIntegerField(help_text="the job's incarnation it was made for")
    node_rank = models.PositiveIntegerField(help_text="0: the lead host (rendezvous endpoint, "
                                            "supervisor)")
    slots = models.JSONField(default=list, help_text="slot indices on the host")
    created_at = models.DateTimeField(auto_now_add=True)
    beat_at = models.DateTimeField(null=True, blank=True,
                                   help_text="the host's part of the job beats it")
    released_at = models.DateTimeField(null=True, blank=True)

    objects = ReservationQuerySet.as_manager()

    class Meta:
        ordering = ["job", "incarnation", "node_rank"]
        indexes = [models.Index(fields=["host", "released_at"]),
                   models.Index(fields=["job", "released_at"])]

    def __str__(self) -> str:
        return (f"job {self.job_id}#{self.incarnation} node {self.node_rank} on host "
                f"{self.host_id} slots {self.slots}")


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
        Command.objects.filter(pk=self.pk, state=CommandState.PENDING).update(
            state=CommandState.DELIVERED, updated_at=timezone.now())
        self.refresh_from_db()

    def settle(self, done: bool, result: dict[str, Any]) -> bool:
        """Record the outcome once; False if it was already settled."""
        open_states = (CommandState.PENDING, CommandState.DELIVERED)
        settled = Command.objects.filter(pk=self.pk, state__in=open_states).update(
            state=CommandState.DONE if done else CommandState.REFUSED, result=result,
            updated_at=timezone.now())
        self.refresh_from_db()
        return bool(settled)

    @classmethod
    def open_for(cls, job: Job) -> models.QuerySet[Command]:
        return cls.objects.filter(job=job, state__in=(CommandState.PENDING,
                                                      CommandState.DELIVERED))


class ExportState(models.TextChoices):
    PENDING = "pending"  # queued for a worker
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class Export(models.Model):
    """A checkpoint exported as a Hugging Face model folder (jobs.exports); one per checkpoint,
    whose folder an export done again rewrites."""

    checkpoint = models.OneToOneField("monitor.Checkpoint", on_delete=models.CASCADE,
                                      related_name="export")
    state = models.CharField(max_length=8, choices=ExportState.choices,
                             default=ExportState.PENDING)
    out_dir = models.CharField(max_length=1024, help_text="the model folder")
    error = models.TextField(blank=True)
    summary = models.JSONField(default=dict, blank=True,
                               help_text="engine.export's summary: files, tensors, bytes")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"export of checkpoint {self.checkpoint_id} ({self.state})"

    def record(self, state: str, *, error: str = "", summary: dict | None = None) -> None:
        self.state, self.error, self.summary = state, error, summary or {}
        self.save(update_fields=["state", "error", "summary", "updated_at"])


class Evaluation(models.Model):
    """One evaluation of a checkpoint (jobs.evaluations): held-out loss and perplexity per
    source, the user's tasks, generations. A checkpoint may be evaluated many times (other
    tasks, again); each keeps its own folder of per-item records."""

    checkpoint = models.ForeignKey("monitor.Checkpoint", on_delete=models.CASCADE,
                                   related_name="evaluations")
    # a worker's task, as an export's: the same states
    state = models.CharField(max_length=8, choices=ExportState.choices,
                             default=ExportState.PENDING)
    tasks = models.CharField(max_length=1024, blank=True,
                             help_text="the task file (JSONL) under the user's data roots; "
                                       "empty: held-out loss only")
    heldout_windows = models.PositiveIntegerField(default=32,
                                                  help_text="held-out windows per source")
    slots = models.PositiveSmallIntegerField(default=1, help_text=(
        "the most slots it uses at once: as many as no training job holds or waits for"))
    out_dir = models.CharField(max_length=1024, help_text="the per-item records and results")
    items_done = models.PositiveIntegerField(default=0)
    items_total = models.PositiveIntegerField(null=True, help_text="null until it started")
    results = models.JSONField(default=dict, blank=True,
                               help_text="engine.evaluate's summary: heldout {source: {loss, "
                                         "perplexity}}, tasks {name: scores}, generations")
    error = models.TextField(blank=True)
    automatic = models.BooleanField(default=False,
                                    help_text="queued by the job's eval.on_checkpoint")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["checkpoint", "pk"]
        constraints = [models.UniqueConstraint(  # however often its event is ingested
            fields=["checkpoint"], condition=models.Q(automatic=True),
            name="one_automatic_evaluation_per_checkpoint")]

    def __str__(self) -> str:
        return f"evaluation {self.pk} of checkpoint {self.checkpoint_id} ({self.state})"

    @property
    def progress(self) -> float | None:
        """The share of its items scored, 0 to 1; None until it started."""
        return self.items_done / self.items_total if self.items_total else None

    def record(self, state: str, *, error: str = "", results: dict | None = None) -> None:
        self.state, self.error = state, error
        if results is not None:
            self.results = results
            self.items_done, self.items_total = results["items_done"], results["items_total"]
        self.save(update_fields=["state", "error", "results", "items_done", "items_total",
                                 "updated_at"])


def _new_key() -> str:
    return secrets.token_hex(20)


def token_digest(key: str) -> str:
    """What is stored of an API token's key: its SHA-256. The key is 160 random bits, not a
    password, so a plain digest is enough to make a copy of the database useless for
    authenticating (no salt or slow hash needed), and equality lookups stay indexed."""
    return hashlib.sha256(key.encode()).hexdigest()


class ApiToken(models.Model):
    """A named API token; a user may hold several and revoke each on its own. Only the
    digest of its key is stored: the key itself is `key` on the instance that created the
    token, shown once, and on no instance loaded from the database."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=64)
    digest = models.CharField(max_length=64, unique=True)
    key: str | None = None
    EXCHANGED = "default"  # the name of the token a password exchange issues
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"token {self.name!r} of {self.user}"

    @property
    def is_active(self) -> bool:
        return self.revoked is None

    @classmethod
    def exchange(cls, user: Any) -> ApiToken:
        """The token a password exchange (the CLI's `login`) answers with: a new `default`
        one, the user's earlier `default` revoked. The server cannot hand back a key it
        does not keep, and replacing it keeps an old login's key from staying valid
        unnoticed; a second machine or a script takes a named token of its own."""
        with transaction.atomic():
            cls.objects.filter(user=user, name=cls.EXCHANGED, revoked__isnull=True).update(
                revoked=timezone.now())
            return cls.objects.create(user=user, name=cls.EXCHANGED)

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.digest:  # a new token: draw its key
            self.key = _new_key()
            self.digest = token_digest(self.key)
        super().save(*args, **kwargs)

    def revoke(self) -> None:
        ApiToken.objects.filter(pk=self.pk, revoked__isnull=True).update(revoked=timezone.now())
        self.refresh_from_db()


class IdempotencyKey(models.Model):
    """The first response to a POST sent with an `Idempotency-Key`, replayed to retries."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=1024)
    status = models.PositiveSmallIntegerField()
    body = models.JSONField(null=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="key_once_per_user")]


class AuditEntry(models.Model):
    """A control action: who did what to which job (or token), and through what."""

    time = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=150, blank=True)
    cause = models.CharField(max_length=16, choices=Cause.choices)
    action = models.CharField(max_length=32, help_text='e.g. "job.create", "job.pause", '
                              '"token.revoke"')
    job = models.ForeignKey(Job, on_delete=models.CASCADE, null=True, blank=True,
                            related_name="audit")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                             blank=True, help_text="the account acted for (a job's owner)")
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-time", "-id"]
        verbose_name_plural = "audit entries"

    @classmethod
    def record(cls, action: str, actor: str, cause: str, *, job: Job | None = None,
               user: Any = None, **details: Any) -> AuditEntry:
        """One entry; for a job, on behalf of its owner."""
        return cls.objects.create(action=action, actor=actor, cause=cause, job=job,
                                  user=user if job is None else job.owner, details=details)


class Webhook(models.Model):
    """Where notifications go: for one job, or (no job) for all of a user's jobs. Payloads
    are signed with HMAC-SHA256 over the body using `secret` (jobs.webhooks)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="webhooks")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, null=True, blank=True,
                            related_name="webhooks")
    url = models.URLField(max_length=1024)
    secret = models.CharField(max_length=64, default=_new_key)
    created = models.DateTimeField(auto_now_add=True)
    last_status = models.CharField(max_length=200, blank=True,
                                   help_text="how the last delivery went")

    class Meta:
        ordering = ["id"]

    @classmethod
    def room_for(cls, owner: models.Model) -> bool:
        """Whether `owner` may add a webhook (under RINGSIDE_WEBHOOKS_PER_USER). Call it in the
        transaction that adds it: the owner's row stays locked until then, so two requests at
        once cannot both take the last place."""
        type(owner).objects.select_for_update().get(pk=owner.pk)
        return cls.objects.filter(owner=owner).count() < settings.RINGSIDE_WEBHOOKS_PER_USER

    @classmethod
    def for_job(cls, job: Job) -> models.QuerySet[Webhook]:
        return cls.objects.filter(owner_id=job.owner_id).filter(
            models.Q(job=job) | models.Q(job__isnull=True))


@dataclass(frozen=True)
class Limits:
    """What one user may take at once; None: no limit."""

    jobs: int | None
    slots: int | None
    checkpoint_bytes: int | None


class Quota(models.Model):
    """A user's own limits, set by staff (the admin); an empty field, or no row, takes the
    setting's default (RINGSIDE_QUOTA_*), and 0 means no limit, there as here."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                primary_key=True, related_name="quota")
    jobs = models.PositiveIntegerField(
        null=True, blank=True, help_text="jobs queued or running at once (a paused or "
        "finished job does not count); empty: RINGSIDE_QUOTA_JOBS; 0: no limit")
    slots = models.PositiveIntegerField(
        null=True, blank=True, help_text="slots its jobs hold at once (a job that would go "
        "over waits); empty: RINGSIDE_QUOTA_SLOTS; 0: no limit")
    checkpoint_bytes = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="bytes of its jobs' checkpoints still stored (a job "
        "that writes one over it is paused); empty: RINGSIDE_QUOTA_CHECKPOINT_BYTES; 0: no "
        "limit")

    def __str__(self) -> str:
        return f"quota of {self.user}"

    @staticmethod
    def limits_of(user: Any) -> Limits:
        own = Quota.objects.filter(user_id=user.pk).first() or Quota()

        def limit(value: int | None, default: int) -> int | None:
            chosen = default if value is None else value
            return chosen or None

        return Limits(jobs=limit(own.jobs, settings.RINGSIDE_QUOTA_JOBS),
                      slots=limit(own.slots, settings.RINGSIDE_QUOTA_SLOTS),
                      checkpoint_bytes=limit(own.checkpoint_bytes,
                                             settings.RINGSIDE_QUOTA_CHECKPOINT_BYTES))
