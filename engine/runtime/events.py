"""The event log: rank 0 writes every event to a JSONL file and, when given a bus, to Redis.

Each event is `{type, job, step, time, seq, ...}`. `seq` numbers a job's events 1, 2, 3...
across restarts of the engine: a new `EventLog` continues after the last sequence number
already in its file or stream. On the bus, the entry id of event `seq` is `"<seq>-0"` in the
stream `ringside:job:<job>:events`, with the event JSON in the entry's `event` field, so a
reader can resume from any sequence number with a plain XREAD/XREADGROUP.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

EVENT_TYPES = ("state", "step", "ops", "experts", "anomaly", "action", "checkpoint", "log")


def events_stream(job: str) -> str:
    return f"ringside:job:{job}:events"


def control_stream(job: str) -> str:
    return f"ringside:job:{job}:control"


def _jsonable(value: Any) -> Any:
    """NaN and infinities are not JSON; they travel as strings so a NaN loss stays visible."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


class EventLog:
    """Appends events for one job; safe to create anew after a crash (sequence continues)."""

    def __init__(self, job: str, path: Path | None = None, bus_url: str | None = None):
        self.job = job
        self.path = path
        self._file = None
        self._redis = None
        last = 0
        self.last_step = 0  # of the newest event, so a restarted engine can speak of it
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            events = read_events(path) if path.exists() else []
            if events:
                last, self.last_step = int(events[-1]["seq"]), int(events[-1]["step"])
            self._file = path.open("a", encoding="utf-8")
        if bus_url:
            import redis

            self._redis = redis.Redis.from_url(bus_url)
            newest = self._redis.xrevrange(events_stream(job), count=1)
            if newest:
                last = max(last, int(newest[0][0].split(b"-")[0]))
        self.seq = last

    def emit(self, type: str, step: int, **fields: Any) -> dict[str, Any]:
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type!r}; valid: {', '.join(EVENT_TYPES)}")
        self.seq += 1
        self.last_step = step
        event = _jsonable(
            {"type": type, "job": self.job, "step": step, "time": time.time(), "seq": self.seq,
             **fields}
        )
        line = json.dumps(event, separators=(",", ":"))
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()
        if self._redis is not None:
            self._redis.xadd(events_stream(self.job), {"event": line}, id=f"{self.seq}-0")
        return event

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._redis is not None:
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
