"""What the engine reported about a job, as stored by the ingest.

Every bus event is one `Event` row (unique per job and sequence number, so a redelivered
event is stored once); replays to websocket clients read these. The events that pages query
by step or by kind are also stored in a typed form:

- `MetricPoint`: step events flattened, one row per (metric, step): long format, indexed by
  (job, name, step), so a series for any step window reads in index order and min/max
  downsampling is a GROUP BY over step buckets.
- `OpsSample`, `ExpertLoad`: one row per (job, step) each, for the per-op timing table and the
  expert-load heatmap, pointing at the event that holds the payload. A step trained again
  (after a restart or a rollback) replaces its row.
- `Anomaly`, `Action`: one row per event (unique per job and sequence number), with the
  fields the markers and feeds filter on as columns. (A `checkpoint` event's row is the jobs
  app's `Checkpoint`: exports, evaluations and rollbacks are made from it.)
"""

from __future__ import annotations

import orjson
from django.db import models


def json_text(value) -> str:
    """`value` as JSON text, as an event document is stored."""
    return orjson.dumps(value).decode()


class EventDocument(models.JSONField):
    """An event as published (a JSON object), stored as its JSON text: `text` on PostgreSQL
    too. No query looks inside an event, and each other type costs the ingest work for
    nothing: `jsonb` converts every number to `numeric` (an `ops` event holds hundreds of
    floats) and `json` parses the text to check it. With lz4 compression (migrations 0004,
    0005) the engine's event mix went in 3x faster as `json` than as `jsonb`, and the inserts
    of the events alone 1.3x faster again as `text` (side by side, on a table of this shape)."""

    def db_type(self, connection) -> str:
        return "text" if connection.vendor == "postgresql" else super().db_type(connection)

    def get_db_prep_value(self, value, connection, prepared=False):
        return None if value is None else json_text(value)

    def from_db_value(self, value, expression, connection):
        return None if value is None else orjson.loads(value)


def _job_key(related_name: str) -> models.ForeignKey:
    """The job a row belongs to. No index of its own: every table here has a unique index
    that starts with the job, and the ingest updates one index fewer per stored row. No
    constraint in the database either: it checked every stored row against the job at
    commit, a fifth of the database's work on the engine's event mix (0.14 of 0.63 s for
    2,000 steps, side by side); the ingest writes only for the job it supervises, and
    deleting a job still deletes its rows (Django's cascade)."""
    return models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name=related_name,
                             db_index=False, db_constraint=False)


class Event(models.Model):
    job = _job_key("bus_events")
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=16)
    step = models.PositiveIntegerField()
    time = models.FloatField(help_text="the engine's wall-clock time, seconds since the epoch")
    data = EventDocument(help_text="the whole event as published")

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="event_once_per_seq")]
        indexes = [models.Index(fields=["job", "type", "seq"])]


class MetricPoint(models.Model):
    job = _job_key("metric_points")
    name = models.CharField(max_length=64, help_text='e.g. "loss", "memory.rss_bytes"')
    step = models.PositiveIntegerField()
    value = models.FloatField(null=True, help_text="null when the engine reported NaN or inf")

    class Meta:
        ordering = ["job", "name", "step"]
        constraints = [
            models.UniqueConstraint(fields=["job", "name", "step"], name="metric_once_per_step")
        ]


class OpsSample(models.Model):
    """One step's per-op timing, aggregated over ranks by the engine (an `ops` event): the
    columns that select and thin steps. The per-op and per-rank tables are the event's own
    data (`Event` with this `seq`), stored once: an `ops` event is the largest the engine
    sends, and a second copy doubled the ingest's database work."""

    job = _job_key("ops_samples")
    step = models.PositiveIntegerField()
    seq = models.PositiveBigIntegerField(help_text="the event this row came from")
    step_ms = models.FloatField(null=True)
    void_share = models.FloatField(null=True, help_text="share of the step in no timed op")
    data_wait_share = models.FloatField(null=True)

    class Meta:
        ordering = ["job", "step"]
        constraints = [models.UniqueConstraint(fields=["job", "step"], name="ops_once_per_step")]


class ExpertLoad(models.Model):
    """One step's routing statistics (an `experts` event): the columns that select and thin
    steps; the per-layer lists are the event's own data (`Event` with this `seq`)."""

    job = _job_key("expert_loads")
    step = models.PositiveIntegerField()
    seq = models.PositiveBigIntegerField(help_text="the event this row came from")
    max_violation = models.FloatField(null=True, help_text="the worst layer's load imbalance")
    dead_experts = models.PositiveIntegerField(default=0, help_text="summed over layers")

    class Meta:
        ordering = ["job", "step"]
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="experts_once_per_step")
        ]


class Anomaly(models.Model):
    job = _job_key("anomalies")
    seq = models.PositiveBigIntegerField()
    step = models.PositiveIntegerField()
    time = models.FloatField()
    kind = models.CharField(max_length=32, help_text='e.g. "loss_spike", "straggler"')
    severity = models.CharField(max_length=16)
    rank = models.IntegerField(null=True, help_text="null: a global signal, no single rank")
    evidence = models.JSONField(default=dict)

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="anomaly_once")]


class Action(models.Model):
    """What was done to the run: by the fault policy, by a command, or by the launcher."""

    job = _job_key("actions")
    seq = models.PositiveBigIntegerField()
    step = models.PositiveIntegerField()
    time = models.FloatField()
    action = models.CharField(max_length=32, help_text='e.g. "rollback", "lr_cut", "refused"')
    by = models.CharField(max_length=16, blank=True, help_text='"policy", "command", ...')
    command = models.CharField(max_length=64, blank=True,
                               help_text="the id of the command it carries out, if any")
    anomaly = models.CharField(max_length=32, blank=True, help_text="the kind it answers")
    details = models.JSONField(default=dict, help_text="the event's other fields")

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="action_once")]
        indexes = [models.Index(fields=["job", "command"])]


class Goodput(models.Model):
    """A job's goodput ledger (monitor.goodput.Ledger as JSON): kept current by the ingest,
    which folds in each stored batch, and by every state transition."""

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, primary_key=True,
                               related_name="goodput")
    ledger = models.JSONField(help_text="monitor.goodput.Ledger.to_dict()")
    last_seq = models.PositiveBigIntegerField(default=0,
                                              help_text="the newest event folded in")
