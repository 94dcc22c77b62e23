"""What jobs needs of monitoring (jobs.telemetry): the ingest and sinks a job's supervisor runs,
and what the platform's fault policy, proposals and calibration read of what a run reported."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import redis
from rest_framework import serializers

from engine.contract import ActionBy
from monitor import pushes
from monitor.ingest import StreamIngest, forward
from monitor.models import Action, Event, OpsSample
from monitor.sinks import consumer as sinks
from monitor.sinks import evaluations as evaluation_sinks
from monitor.sinks import options as sink_options
from monitor.sinks.api import SinkSerializer


def ingest(job_id: int, client: redis.Redis, consumer: str) -> StreamIngest:
    return StreamIngest(job_id, client, consumer=consumer)


def start_sinks(job_id: int, redis_url: str) -> list[Any]:
    return sinks.start(job_id, redis_url)


def stop_sinks(runners: list[Any]) -> None:
    sinks.stop(runners)


def parse_sinks(value: Any, errors: dict[str, str]) -> list[dict[str, str]]:
    try:
        return sink_options.parse(value)
    except sink_options.SinkError as e:
        errors.update(e.errors)
        return []


def attach_sinks(job: Any, configs: list[dict[str, str]] | None) -> None:
    sink_options.attach(job, configs)


def sinks_field(help_text: str) -> serializers.Field:
    return SinkSerializer(many=True, read_only=True, help_text=help_text)


def policy_actions_since(job_id: int, since: float, passive: Collection[str]) -> int:
    return Action.objects.filter(job_id=job_id, by=ActionBy.POLICY, time__gte=since).exclude(
        action__in=passive).count()


def actions(job_id: int, names: Collection[str]) -> list[dict[str, Any]]:
    return list(Action.objects.filter(job_id=job_id, action__in=names).order_by("seq").values(
        "seq", "step", "action", "by", "command", "details"))


def events_data(job_id: int, event_type: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(job_id=job_id, type=event_type).order_by("seq")
                .values_list("data", flat=True))


def push(job_id: int, message: dict[str, Any]) -> None:
    forward(job_id, [{**message, "seq": pushes.newest_seq(job_id)}])


def publish_evaluation(evaluation: Any) -> None:
    evaluation_sinks.publish(evaluation)


def recent_ops(job_id: int, steps: int) -> list[dict[str, Any]]:
    seqs = OpsSample.objects.filter(job_id=job_id, step__gt=1).order_by("-step").values_list(
        "seq", flat=True)[:steps]
    return list(Event.objects.filter(job_id=job_id, seq__in=list(seqs))
                .values_list("data", flat=True))
