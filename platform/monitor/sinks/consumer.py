"""Each sink of a job reads the job's event stream with a consumer group of its own
(`ringside-sink-<kind>`), apart from the ingest's: a tracker that is slow or down holds only
its own group's entries, never the ingest or the engine (which only appends to the stream).

`SinkConsumer.poll` writes the next entries to the tracker and acknowledges them once it took
them; a failure leaves them pending, records the error on the sink's row (the job's page and
API show it), drops the tracker and makes the next poll start again from the pending entries,
so an outage of the tracker loses nothing and reorders nothing. `SinkRunner` polls one sink
in a thread of the job's supervisor while the engine runs, every RINGSIDE_SINK_INTERVAL_S,
waiting longer after each failure;
stopped, it catches up within RINGSIDE_SINK_DRAIN_S and leaves what is left to the Celery task
`catch_up`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

import orjson
import redis
from celery import shared_task
from django.conf import settings
from django.db import connection
from django.utils import timezone
from kombu.exceptions import OperationalError

from engine import contract
from monitor.ingest import READ_COUNT
from monitor.sinks.models import Sink, SinkState
from monitor.sinks.records import TOLD, records
from monitor.sinks.trackers import Tracker, open_tracker

log = logging.getLogger(__name__)

ERROR_CHARS = 1000
# a sink's thread below the engine's ranks in the CPU's queue: on a machine whose cores its
# ranks fill, the sinks take what training leaves (their writes wait; training does not)
SINK_NICENESS = 10
FIRST_RETRY_S = 0.5
CATCH_UP_TRIES = 12


def yield_to_training() -> None:
    """Lower the calling thread's CPU priority to SINK_NICENESS, if it is not lower already
    (processes it starts, such as W&B's service, inherit it). Linux only: elsewhere a
    priority is the whole process's."""
    if sys.platform == "linux":
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread,
                       max(SINK_NICENESS, os.getpriority(os.PRIO_PROCESS, thread)))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def group_of(kind: str) -> str:
    return f"ringside-sink-{kind}"


class SinkConsumer:
    def __init__(self, sink: Sink, client: redis.Redis):
        self.sink, self.client = sink, client
        self.stream = contract.events_stream(str(sink.job_id))
        self.group = group_of(sink.kind)
        self.consumer = f"sink-{sink.job_id}"
        self.tracker: Tracker | None = None
        self._pending = True  # first re-read what was delivered and never acknowledged
        self._create_group()

    def _create_group(self) -> None:
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def poll(self, block_ms: int | None = None, count: int = READ_COUNT) -> int:
        """Write the next entries to the tracker and acknowledge them; how many there were.
        Raises what the bus or the tracker raised, after recording it."""
        try:
            ids, events = self._read(block_ms, count)
            told = records(events)
            if told:
                if self.tracker is None:
                    self.tracker = open_tracker(self.sink)
                self.tracker.write(told)
            if ids:
                self.client.xack(self.stream, self.group, *ids)
        except Exception as error:  # whatever a tracker's client raises: retried the same way
            self._pending = True
            self.close()
            self._record(SinkState.FAILING, f"{type(error).__name__}: {error}"[:ERROR_CHARS])
            raise
        if ids:  # the newest entry taken, parsed or passed by
            self.sink.last_seq = max(self.sink.last_seq, contract.entry_seq(ids[-1])[0])
        if ids or self.sink.state == SinkState.FAILING:
            self._record(SinkState.WRITING, "")
        return len(ids)

    def _read(self, block_ms: int | None, count: int) -> tuple[list, list[dict[str, Any]]]:
        while True:
            try:
                reply = self.client.xreadgroup(
                    self.group, self.consumer, {self.stream: "0" if self._pending else ">"},
                    count=count, block=None if self._pending else block_ms)
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._create_group()  # the bus came back without its data
                continue
            entries = reply[0][1] if reply else []
            if entries or not self._pending:
                break
            self._pending = False
        events = []
        for entry_id, fields in entries:
            kind = contract.entry_field(fields, contract.StreamField.TYPE)
            if kind is not None and _text(kind) not in TOLD:
                continue  # acknowledged with the rest, never parsed
            try:
                events.append(orjson.loads(contract.entry_field(fields,
                                                                contract.StreamField.EVENT)))
            except (TypeError, ValueError):
                log.error("job %s: unreadable event %s skipped by its %s sink",
                          self.sink.job_id, entry_id, self.sink.kind)
        return [entry_id for entry_id, _ in entries], events

    def caught_up(self) -> bool:
        """Whether the group holds nothing unacknowledged and nothing unread."""
        return self.poll(block_ms=None) == 0 and not self._pending

    def _record(self, state: str, error: str) -> None:
        """The sink's state on its row; `error` says why it fails, empty once it writes."""
        self.sink.state, self.sink.last_error = state, error
        Sink.objects.filter(pk=self.sink.pk).update(
            state=state, last_seq=self.sink.last_seq, last_error=self.sink.last_error,
            updated=timezone.now())

    def close(self, state: str | None = None) -> None:
        """Let the tracker go (a W&B run finishes); `state`: record it too."""
        tracker, self.tracker = self.tracker, None
        if tracker is not None:
            try:
                tracker.close()
            except Exception:  # a tracker that failed may fail to close as well
                log.warning("job %s: the %s sink's tracker did not close cleanly",
                            self.sink.job_id, self.sink.kind, exc_info=True)
        if state is not None:
            self._record(state, "")


class SinkRunner(threading.Thread):
    """One sink of a running job, polled in a thread of its supervisor's process."""

    def __init__(self, sink: Sink, redis_url: str, block_ms: int = 500):
        super().__init__(name=f"sink-{sink.job_id}-{sink.kind}", daemon=True)
        self.sink, self.redis_url, self.block_ms = sink, redis_url, block_ms
        self.stopping = threading.Event()

    def run(self) -> None:
        yield_to_training()
        client = redis.Redis.from_url(self.redis_url)
        consumer = None
        try:
            consumer = SinkConsumer(self.sink, client)
            self._follow(consumer)
            done = self._catch_up(consumer)
            consumer.close(SinkState.CLOSED if done else None)
        except Exception:
            log.exception("job %s: the %s sink stopped", self.sink.job_id, self.sink.kind)
            done = False
        finally:
            client.close()
        if not done:
            _send_catch_up(self.sink)
        connection.close()  # this thread's own database connection

    def _follow(self, consumer: SinkConsumer) -> None:
        retry_s = FIRST_RETRY_S
        while not self.stopping.is_set():
            try:
                consumer.poll(block_ms=self.block_ms)
                retry_s = FIRST_RETRY_S
                # a tracker is no live view: a batch of steps per write costs a run's training
                # far less CPU than a write per step (one MLflow request, one flush)
                self.stopping.wait(settings.RINGSIDE_SINK_INTERVAL_S)
            except Exception as error:
                log.warning("job %s: the %s sink failed (%s); again in %.1f s",
                            self.sink.job_id, self.sink.kind, error, retry_s)
                self.stopping.wait(retry_s)
                retry_s = min(retry_s * 2, settings.RINGSIDE_SINK_RETRY_MAX_S)

    def _catch_up(self, consumer: SinkConsumer) -> bool:
        """What the engine published last, within RINGSIDE_SINK_DRAIN_S; whether all of it."""
        deadline = time.monotonic() + settings.RINGSIDE_SINK_DRAIN_S
        while time.monotonic() < deadline:
            try:
                if consumer.caught_up():
                    return True
            except Exception:
                time.sleep(min(FIRST_RETRY_S, max(0.0, deadline - time.monotonic())))
        return False

    def stop(self) -> None:
        self.stopping.set()


def _send_catch_up(sink: Sink) -> None:
    try:
        catch_up.delay(sink.pk)
    except OperationalError as error:  # the broker is down: the next launch re-reads them
        log.warning("job %s: the %s sink's pending events wait for the job's next launch (%s)",
                    sink.job_id, sink.kind, error)


def start(job_id: int, redis_url: str) -> list[SinkRunner]:
    """A running thread for each sink of the job."""
    runners = [SinkRunner(sink, redis_url) for sink in Sink.objects.filter(job_id=job_id)]
    for runner in runners:
        runner.start()
    return runners


def stop(runners: list[SinkRunner]) -> None:
    """Tell the job's sinks the engine exited: each stops once it caught up or its drain time
    ran out (what it left pending goes to `catch_up`), without holding the caller."""
    for runner in runners:
        runner.stop()


@shared_task(bind=True, name="monitor.sinks.catch_up", max_retries=CATCH_UP_TRIES)
def catch_up(self, sink_id: int) -> str:
    """Write what a stopped job's sink left pending (its tracker was down when the engine
    exited), retried with backoff while the tracker stays down."""
    sink = Sink.objects.filter(pk=sink_id).first()
    if sink is None:
        return "gone"
    client = redis.Redis.from_url(settings.REDIS_URL)
    consumer = SinkConsumer(sink, client)
    try:
        while not consumer.caught_up():
            pass
    except Exception as error:
        consumer.close()
        raise self.retry(countdown=min(FIRST_RETRY_S * 2 ** (self.request.retries + 4),
                                       settings.RINGSIDE_SINK_RETRY_MAX_S)) from error
    finally:
        client.close()
    consumer.close(SinkState.CLOSED)
    return SinkState.CLOSED
