"""Access to the API and what it keeps: named tokens (`ApiToken`), replayable POSTs
(`IdempotencyKey`), the audit trail (`AuditEntry`), signed notifications (`Webhook`), and each
user's limits (`Quota`)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from jobs.models.job import Cause, Job


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
