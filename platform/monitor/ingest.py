"""The ingest: one job's event stream → database → the job's websocket group.

`StreamIngest.poll` reads the stream `ringside:job:<id>:events` with a consumer group, stores
a batch in one transaction, acknowledges the batch only after the commit, then forwards each
event to the channel-layer group `job-<id>`. After a crash, a new StreamIngest under the same
consumer name first re-reads what was delivered but never acknowledged; storage ignores
sequence numbers it already has, so every event is stored exactly once.

The job supervisor (jobs.tasks.run_job) drives one StreamIngest per job today; the same class
is meant to run inside a standalone consumer process later.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from typing import Any

import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from engine.runtime.events import events_stream
from jobs.models import Job
from monitor.models import Event, MetricPoint

log = logging.getLogger(__name__)

GROUP = "ringside-ingest"


def job_group(job_id: int) -> str:
    """The channel-layer group that a job's websocket clients join."""
    return f"job-{job_id}"


def step_metrics(event: dict[str, Any]) -> dict[str, float | None]:
    """The numeric fields of a step event, nested objects flattened as `memory.rss_bytes`."""
    skip = {"type", "job", "step", "time", "seq"}
    metrics: dict[str, float | None] = {}

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                visit(f"{prefix}{key}.", inner)
        elif isinstance(value, bool):
            return
        elif isinstance(value, int | float):
            metrics[prefix[:-1]] = float(value) if math.isfinite(value) else None
        elif isinstance(value, str) and value in ("nan", "inf", "-inf"):
            metrics[prefix[:-1]] = None  # the event log spells non-finite floats as strings

    for key, value in event.items():
        if key not in skip:
            visit(f"{key}.", value)
    return metrics


def store_events(job_id: int, events: Iterable[dict[str, Any]]) -> None:
    """Write events (and the metrics of step events) in one transaction; duplicates are no-ops."""
    events = list(events)
    if not events:
        return
    rows = [
        Event(job_id=job_id, seq=e["seq"], type=e["type"], step=e.get("step", 0),
              time=e.get("time", 0.0), data=e)
        for e in events
    ]
    # A step trained again (after a restart or a rollback) replaces its earlier values: the
    # later event wins, within this batch and over what is stored.
    latest = {
        (name[:64], e["step"]): value
        for e in sorted(events, key=lambda e: e["seq"]) if e["type"] == "step"
        for name, value in step_metrics(e).items()
    }
    points = [MetricPoint(job_id=job_id, name=name, step=step, value=value)
              for (name, step), value in latest.items()]
    last_step = max(e.get("step", 0) for e in events)
    with transaction.atomic():
        Event.objects.bulk_create(rows, ignore_conflicts=True)
        MetricPoint.objects.bulk_create(
            points, update_conflicts=True, unique_fields=["job", "name", "step"],
            update_fields=["value"], batch_size=2000,
        )
        # only forward: a replayed old batch must not move the job's step back
        Job.objects.filter(pk=job_id, step__lt=last_step).update(step=last_step)


def forward(job_id: int, messages: list[dict[str, Any]]) -> None:
    """Send messages (JSON-ready dicts with `type` and `seq`) to the job's websocket clients."""
    if not messages:
        return
    layer = get_channel_layer()

    async def send_all() -> None:
        for message in messages:
            await layer.group_send(job_group(job_id), {"type": "job.message", "message": message})

    async_to_sync(send_all)()


class StreamIngest:
    def __init__(self, job_id: int, client: redis.Redis, consumer: str = "supervisor"):
        self.job_id = job_id
        self.client = client
        self.consumer = consumer
        self.stream = events_stream(str(job_id))
        self.last_seq = 0
        self._recovering = True  # first re-read our delivered-but-unacknowledged entries
        try:
            client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def poll(self, block_ms: int | None = 500, count: int = 500) -> list[dict[str, Any]]:
        """Store, acknowledge and forward the next batch; return its events (maybe none).

        Waits up to `block_ms` for new events; None returns at once.
        """
        start = "0" if self._recovering else ">"
        reply = self.client.xreadgroup(
            GROUP, self.consumer, {self.stream: start}, count=count,
            block=None if self._recovering else block_ms,
        )
        entries = reply[0][1] if reply else []
        if self._recovering and not entries:
            self._recovering = False
            return self.poll(block_ms, count)
        ids, events = [], []
        for entry_id, fields in entries:
            ids.append(entry_id)
            raw = fields.get(b"event") or fields.get("event")
            try:
                events.append(json.loads(raw))
            except (TypeError, ValueError):
                log.error("job %s: unreadable event %s in %s skipped", self.job_id, entry_id,
                          self.stream)
        store_events(self.job_id, events)
        if ids:
            self.client.xack(self.stream, GROUP, *ids)
        if events:
            self.last_seq = max(self.last_seq, *(e["seq"] for e in events))
        forward(self.job_id, events)
        return events

    def drain(self) -> list[dict[str, Any]]:
        """Everything still in the stream, without waiting for more."""
        drained = []
        while batch := self.poll(block_ms=None):
            drained.extend(batch)
        return drained
