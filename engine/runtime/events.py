"""The event log: rank 0 writes every event to a JSONL file and, when given a bus, to Redis.

Each event is a typed `engine.contract` event; its wire form is `{type, job, step, time, seq,
...}`. `seq` numbers a job's events 1, 2, 3...
across restarts of the engine: a new `EventLog` continues after the last sequence number
already in its file or stream. On the bus, the entry id of event `seq` is `"<seq>-0"` in the
stream `ringside:job:<job>:events`, with the event JSON in the entry's `event` field, so a
reader can resume from any sequence number with a plain XREAD/XREADGROUP.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.contract import (
    Event,
    Header,
    _jsonable,
    control_stream,
    entry_id,
    entry_seq,
    events_stream,
    stream_entry,
)

if TYPE_CHECKING:
    import redis

__all__ = ["BusOutage", "EventLog", "bus_client", "bus_unreachable", "control_stream",
           "events_stream", "read_events"]

log = logging.getLogger(__name__)


# While the bus is unreachable, it is tried again at most this often (a try that fails on a
# refused connection costs a millisecond; one to a vanished host, up to BUS_TIMEOUT_S)
BUS_RETRY_S = 1.0
BUS_TIMEOUT_S = 2.0
# how long `close` keeps trying to publish what the bus has not taken yet
BUS_CLOSE_WAIT_S = 30.0


def bus_client(url: str) -> redis.Redis:
    """A Redis client for the engine's side of the bus, with timeouts, so a bus that went
    away costs a step at most BUS_TIMEOUT_S."""
    import redis

    return redis.Redis.from_url(url, socket_connect_timeout=BUS_TIMEOUT_S,
                                socket_timeout=BUS_TIMEOUT_S)


def bus_unreachable(error: Exception) -> bool:
    """Whether `error` says the bus is down or out of reach (rather than refusing a call)."""
    import redis

    return isinstance(error, redis.ConnectionError | redis.TimeoutError)


class BusOutage:
    """When a bus that was unreachable may be tried again; logs once when it goes away and
    once when it is back."""

    def __init__(self, job: str, what: str):
        self.job, self.what = job, what
        self.down = False
        self.since = 0.0  # monotonic time the current outage began
        self._retry_at = 0.0

    def may_try(self) -> bool:
        return time.monotonic() >= self._retry_at

    def failed(self, error: Exception) -> None:
        if not self.down:
            log.warning("job %s: the bus is unreachable (%s); %s", self.job, error, self.what)
            self.since = time.monotonic()
        self.down = True
        self._retry_at = time.monotonic() + BUS_RETRY_S

    def succeeded(self) -> None:
        if self.down:
            log.warning("job %s: the bus is back", self.job)
        self.down = False
        self._retry_at = 0.0


class EventLog:
    """Appends events for one job; safe to create anew after a crash (sequence continues).

    The run outlives an outage of the bus: an event the bus cannot take waits, in order, with
    those after it (they are all in the file already), and training goes on; the bus is tried
    again at the next event (at most every BUS_RETRY_S), and `close` waits up to
    BUS_CLOSE_WAIT_S for it. The stream then holds every event once, in sequence order,
    provided the bus kept its data (the platform's own Redis keeps an append-only file).
    """

    def __init__(self, job: str, path: Path | None = None, bus_url: str | None = None):
        self.job = job
        self.path = path
        self._file = None
        self._redis = None
        self._unsent: deque[tuple[int, dict[str, str]]] = deque()  # (seq, entry) not yet taken
        self._outage = BusOutage(job, "events wait for it")
        last = 0
        self.last_step = 0  # of the newest event, so a restarted engine can speak of it
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            events = read_events(path) if path.exists() else []
            if events:
                last, self.last_step = int(events[-1]["seq"]), int(events[-1]["step"])
            self._file = path.open("a", encoding="utf-8")
        if bus_url:
            self._redis = bus_client(bus_url)
            newest = self._redis.xrevrange(events_stream(job), count=1)
            if newest:
                last = max(last, entry_seq(newest[0][0])[0])
        self.seq = last

    def emit(self, event: Event) -> dict[str, Any]:
        """Stamp `event` with the job, the time and the next sequence number, write it and
        return its wire form (`event.to_dict()`)."""
        self.seq += 1
        wire = dataclasses.replace(event, job=self.job, time=time.time(), seq=self.seq).to_dict()
        return self._write({key.value: wire[key] for key in Header} | wire)

    def emit_wire(self, type: str, step: int, **fields: Any) -> dict[str, Any]:
        """Write an event as given, typed or not: for tests and benchmarks that replay recorded
        streams or feed the platform deliberately malformed events. The engine uses `emit`."""
        self.seq += 1
        return self._write(_jsonable({"type": type, "job": self.job, "step": step,
                                      "time": time.time(), "seq": self.seq, **fields}))

    def _write(self, wire: dict[str, Any]) -> dict[str, Any]:
        self.last_step = wire["step"]
        line = json.dumps(wire, separators=(",", ":"))
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()
        if self._redis is not None:
            self._unsent.append((self.seq, stream_entry(wire["type"], line)))
            if self._outage.may_try():
                self._publish()
        return wire

    def _publish(self) -> bool:
        """Hand the bus what it has not taken yet, oldest first; False if it is unreachable."""
        import redis

        try:
            while self._unsent:
                seq, entry = self._unsent[0]
                try:
                    self._redis.xadd(events_stream(self.job), entry, id=entry_id(seq))
                except redis.ResponseError as error:
                    # the bus took it before, and the reply was lost with the connection
                    if "equal or smaller" not in str(error):
                        raise
                self._unsent.popleft()
        except Exception as error:
            if not bus_unreachable(error):
                raise
            self._outage.failed(error)
            return False
        self._outage.succeeded()
        return True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._redis is not None:
            deadline = time.monotonic() + BUS_CLOSE_WAIT_S
            while not self._publish() and time.monotonic() < deadline:
                time.sleep(BUS_RETRY_S)
            if self._unsent:
                log.error("job %s: %d events never reached the event bus (they are in %s)",
                          self.job, len(self._unsent), self.path)
            self._redis.close()
            self._redis = None


def read_events(path: Path) -> list[dict[str, Any]]:
    """All complete events in a JSONL file, in order."""
    events = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events
