"""What a job's supervisor runs of the monitoring of its launch: the job's ingest (bus →
database → websockets), which it pumps and whose stored events it acts on, and the metric sinks
that follow the stream beside it. The `monitor` app, which builds on this one, provides them
when it is ready (monitor.apps, monitor.supervised), so jobs imports no module of monitor here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from common.provided import Provided

if TYPE_CHECKING:
    import redis

    from engine.contract import Event


class Ingest(Protocol):
    def poll(self, block_ms: int | None = ...) -> list[Event]:
        """The events stored since the last call, waiting up to `block_ms` for some."""

    def drain(self) -> list[Event]:
        """Every event on the bus not stored yet, stored."""


class Telemetry(Protocol):
    def ingest(self, job_id: int, client: redis.Redis, consumer: str) -> Ingest:
        """The job's ingest, as consumer `consumer` of its stream."""

    def start_sinks(self, job_id: int, redis_url: str) -> Any:
        """The job's sinks, each following the stream on a thread of its own."""

    def stop_sinks(self, runners: Any) -> None:
        """Tell the sinks `start_sinks` started that the engine exited."""


telemetry: Provided[Telemetry] = Provided("a launch's ingest and sinks (the monitor app)")
