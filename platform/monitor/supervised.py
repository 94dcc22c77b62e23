"""The monitoring a job's supervisor runs (jobs.telemetry): the job's ingest and its sinks."""

from __future__ import annotations

from typing import Any

import redis

from monitor.ingest import StreamIngest
from monitor.sinks import consumer as sinks


def ingest(job_id: int, client: redis.Redis, consumer: str) -> StreamIngest:
    return StreamIngest(job_id, client, consumer=consumer)


def start_sinks(job_id: int, redis_url: str) -> list[Any]:
    return sinks.start(job_id, redis_url)


def stop_sinks(runners: list[Any]) -> None:
    sinks.stop(runners)
