"""What jobs needs of the monitoring of its runs: the job's ingest (bus → database →
websockets), which a supervisor pumps and whose stored events it acts on; the metric sinks that
follow the stream beside it (which a job-create body names and a job's detail shows); what the
platform's fault policy, proposals, calibration and history (jobs.history) read of what a run
reported. The `monitor` app, which builds on this one, provides them when it is ready
(monitor.apps, monitor.provided), so these modules of jobs import none of monitor."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Protocol

from common.provided import Provided

if TYPE_CHECKING:
    import redis
    from rest_framework import serializers

    from engine.contract import Event
    from jobs.models import Job


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

    def parse_sinks(self, value: Any, errors: dict[str, str]) -> list[dict[str, str]]:
        """The configs of a job-create body's `sinks`, one per tracker; what is wrong is added
        to `errors` by dotted field (`sinks.1.tracking_uri`)."""

    def attach_sinks(self, job: Job, configs: list[dict[str, str]] | None) -> None:
        """Give `job` its sinks: `configs`, or (None) its owner's defaults."""

    def sinks_field(self, help_text: str) -> serializers.Field:
        """The read-only serializer field of a job's sinks as its detail shows them."""

    def policy_actions_since(self, job_id: int, since: float, passive: Collection[str]) -> int:
        """The actions the engine's fault policy took in the job since `since` (a timestamp),
        those named in `passive` aside."""

    def actions(self, job_id: int, names: Collection[str]) -> list[dict[str, Any]]:
        """The engine's stored actions of the job named in `names`, oldest first: each its
        `seq`, `step`, `action`, `by`, `command` and `details`."""

    def events_data(self, job_id: int, event_type: str) -> list[dict[str, Any]]:
        """What the job's stored events of `event_type` say, oldest first."""

    def push(self, job_id: int, message: dict[str, Any]) -> None:
        """`message` to the job's page sockets, its `seq` the newest event the page may hold."""

    def publish_evaluation(self, evaluation: Any) -> None:
        """A finished evaluation's results to the job's sinks, at its checkpoint's step."""

    def recent_ops(self, job_id: int, steps: int) -> list[dict[str, Any]]:
        """What the job's `ops` events of its last `steps` steps say (its first step, a
        warm-up, left out)."""


telemetry: Provided[Telemetry] = Provided("the monitoring of runs (the monitor app)")
