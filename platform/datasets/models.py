"""A registered dataset: its sources, tokenizer and held-out fraction, and what preparing it made.

A dataset is owned like a job (its owner sees it; staff see all, and may share one with
everyone). Its state moves registered → preparing → ready, or failed with the message; a
failed or interrupted prepare is queued again and the engine resumes it from its last finished
shard. The prepared folder (`folder`) is the platform's: under RUNS_DIR/datasets/<id>, or under
the configured object store (RINGSIDE_STORAGE_URL); its `manifest.json` is written last, so a
ready dataset is whole.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from jobs.models import TERMINAL, Job


class DatasetState(models.TextChoices):
    REGISTERED = "registered"
    PREPARING = "preparing"
    READY = "ready"
    FAILED = "failed"


def prepared_folder(dataset_id: int) -> str:
    """Where the platform prepares dataset `dataset_id`: its storage, never a user's path."""
    if settings.STORAGE_URL:
        return f"{settings.STORAGE_URL}/datasets/{dataset_id}"
    return str(settings.RUNS_DIR / "datasets" / str(dataset_id))


class Dataset(models.Model):
    name = models.CharField(max_length=64)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="datasets")
    shared = models.BooleanField(default=False, help_text="every user may train on it (staff "
                                                          "set it)")
    sources = models.JSONField(help_text='[{"kind", "paths", "field"}], paths resolved')
    tokenizer = models.CharField(max_length=1024, default="bytes")
    holdout = models.FloatField(default=0.01, help_text="fraction of documents held out")
    state = models.CharField(max_length=16, choices=DatasetState.choices,
                             default=DatasetState.REGISTERED)
    error = models.TextField(blank=True)
    progress = models.JSONField(default=dict, blank=True,
                                help_text="the prepare's latest progress (engine.data.prepare)")
    manifest = models.JSONField(null=True, blank=True, help_text="the prepared manifest")
    folder = models.CharField(max_length=1024, blank=True, help_text="the prepared folder")
    created_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True,
                                        help_text="the prepare's last sign of life")
    prepared_at = models.DateTimeField(null=True, blank=True)
    used_by = models.ManyToManyField(Job, related_name="datasets", blank=True,
                                     help_text="the jobs that train on it")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"],
                                               name="dataset_name_once_per_owner")]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"

    def active_jobs(self) -> models.QuerySet[Job]:
        """The jobs training on it that have not finished: while any is, it stays."""
        return self.used_by.exclude(state__in=TERMINAL)

    def record(self, state: str | None = None, **fields: Any) -> None:
        """Write `state` and `fields` (and the prepare's heartbeat) to its row."""
        if state is not None:
            fields["state"] = state
        fields["heartbeat_at"] = timezone.now()
        Dataset.objects.filter(pk=self.pk).update(**fields)
        for name, value in fields.items():
            setattr(self, name, value)

    @property
    def vocab_size(self) -> int | None:
        return (self.manifest or {}).get("tokenizer", {}).get("vocab_size")


def visible_datasets(user: Any) -> models.QuerySet[Dataset]:
    """The datasets `user` may see and train on: their own and the shared ones; staff: all."""
    found = Dataset.objects.select_related("owner")
    if not user.is_authenticated:
        return found.none()
    return found if user.is_staff else found.filter(models.Q(owner=user) | models.Q(shared=True))


def split_counts(manifest: dict[str, Any] | None, split: str) -> dict[str, int]:
    """`{"documents", "tokens"}` of one split ("train" or "heldout") of a prepared manifest."""
    return (manifest or {}).get("splits", {}).get(split, {"documents": 0, "tokens": 0})
