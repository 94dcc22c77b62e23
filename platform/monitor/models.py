"""What the engine reported about a job, as stored by the ingest.

Every bus event is one `Event` row (unique per job and sequence number, so a redelivered
event is stored once). Step events are also flattened into `MetricPoint` rows, one per
(metric, step): long format, indexed by (job, name, step), so a series for any step window
reads in index order and min/max downsampling is a GROUP BY over step buckets.
"""

from django.db import models


class Event(models.Model):
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="bus_events")
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=16)
    step = models.PositiveIntegerField()
    time = models.FloatField(help_text="the engine's wall-clock time, seconds since the epoch")
    data = models.JSONField(help_text="the whole event as published")

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="event_once_per_seq")]
        indexes = [models.Index(fields=["job", "type", "seq"])]


class MetricPoint(models.Model):
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="metric_points")
    name = models.CharField(max_length=64, help_text='e.g. "loss", "memory.rss_bytes"')
    step = models.PositiveIntegerField()
    value = models.FloatField(null=True, help_text="null when the engine reported NaN or inf")

    class Meta:
        ordering = ["job", "name", "step"]
        constraints = [
            models.UniqueConstraint(fields=["job", "name", "step"], name="metric_once_per_step")
        ]
