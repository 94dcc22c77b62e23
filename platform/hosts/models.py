"""A worker host: one row per machine name, upserted by its worker at start and beaten every
HOST_BEAT_S. A host is up while its beat is younger than HOST_LOST_AFTER_S, no peer has found
it silent since (`lost_at`: a job's other hosts, or the reaper, saw it stop before the beat
aged; its next beat clears it) and it is not drained; lost ones keep their row (a returning
worker takes it over)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


def lost_before() -> timezone.datetime:
    """A host whose last beat is older than this is lost."""
    return timezone.now() - timedelta(seconds=settings.HOST_LOST_AFTER_S)


class HostQuerySet(models.QuerySet):
    def up(self) -> HostQuerySet:
        """Hosts that beat recently and take placements (not drained)."""
        return self.live().filter(drained=False)

    def live(self) -> HostQuerySet:
        """Hosts that beat recently, drained or not."""
        return self.filter(beat_at__gte=lost_before(), lost_at__isnull=True)


class Host(models.Model):
    name = models.CharField(max_length=200, unique=True)
    address = models.CharField(max_length=200, help_text="where its peers reach it")
    # {"cpu": {"cores", "memory_bytes"}, "gpus": [{"name", "memory_bytes"}]}
    devices = models.JSONField(default=dict)
    slots = models.PositiveIntegerField(
        help_text="ranks it runs at once: a GPU each, or WORKER_SLOTS on CPU")
    labels = models.JSONField(default=dict, blank=True)
    version = models.CharField(max_length=100, blank=True)
    instance = models.CharField(max_length=255, help_text="the worker process holding the name")
    started_at = models.DateTimeField(default=timezone.now)
    beat_at = models.DateTimeField()
    drained = models.BooleanField(default=False)
    lost_at = models.DateTimeField(null=True, blank=True, help_text=(
        "when a peer found it silent (jobs.membership); lost until its next beat"))
    # worker clock - database clock at its last beat: shown, never used to judge its beat
    clock_offset_s = models.FloatField(default=0.0)

    objects = HostQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_lost(self) -> bool:
        return self.beat_at < lost_before() or self.lost_at is not None

    @property
    def queue(self) -> str:
        """The Celery queue only this host's worker consumes."""
        return f"host.{self.name}"

    @property
    def state(self) -> str:
        """"lost" (no recent beat) wins over "drained"; else "up"."""
        if self.is_lost:
            return "lost"
        return "drained" if self.drained else "up"
