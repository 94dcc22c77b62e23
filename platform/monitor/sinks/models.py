"""A job's sinks with their progress, its owner's default sinks and tracker tokens."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class SinkKind(models.TextChoices):
    TENSORBOARD = "tensorboard"
    MLFLOW = "mlflow"
    WANDB = "wandb"


class SinkState(models.TextChoices):
    WAITING = "waiting", "waiting for the job's events"
    WRITING = "writing", "up to date with the events read"
    FAILING = "failing", "its tracker refused or was unreachable; retrying"
    CLOSED = "closed", "every event of the job's last run written"


class Sink(models.Model):
    """One tracker a job writes to: its settings (`config`, as `options.parse` made it; never a
    secret), how far it got and how its last write went."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="sinks")
    kind = models.CharField(max_length=16, choices=SinkKind.choices)
    config = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=SinkState.choices,
                             default=SinkState.WAITING)
    last_seq = models.PositiveBigIntegerField(default=0, help_text="the last event written")
    last_error = models.TextField(blank=True, help_text="why it fails now; empty while it writes")
    run_id = models.CharField(max_length=128, blank=True,
                              help_text="the tracker's run (MLflow, W&B): a relaunch continues it")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "kind"], name="one_sink_per_kind")]
        ordering = ["job", "kind"]

    def __str__(self) -> str:
        return f"{self.kind} sink of job {self.job_id} ({self.state})"


class SinkDefaults(models.Model):
    """The sinks a user's new jobs get when their body names none."""

    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                 related_name="sink_defaults")
    sinks = models.JSONField(default=list, blank=True)


class SecretName(models.TextChoices):
    WANDB_API_KEY = "wandb_api_key"
    MLFLOW_TOKEN = "mlflow_token"


class Secret(models.Model):
    """A user's token for a tracker, encrypted (monitor.sinks.secrets); never shown again."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="secrets")
    name = models.CharField(max_length=32, choices=SecretName.choices)
    ciphertext = models.BinaryField()
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "name"],
                                               name="one_secret_per_name")]
        ordering = ["name"]
