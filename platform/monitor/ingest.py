"""The ingest: one job's event stream → database → the job's websocket group.

`StreamIngest.poll` reads the stream `ringside:job:<id>:events` with a consumer group, stores
a batch in one transaction, acknowledges the batch only after the commit, then forwards the
events to the channel-layer group `job-<id>`, and after them the job's goodput ledger, which
the batch's transaction brought up to date (monitor.goodput). The next batch is read, parsed
and turned into rows (`prepare`) on another thread while the current one is written, which the
database's work leaves free to run (the engine's event mix into PostgreSQL on a 2-core machine:
about 2,900 events/s without it, 3,700-5,000 with it). After a crash, a new StreamIngest under
the same consumer name first re-reads what was delivered to it but never acknowledged; one
under another name first claims what a dead consumer left pending (idle for `claim_idle_ms`). A
poll that fails (Redis or the database went away) leaves the next one to start again from this
consumer's unacknowledged entries, so an outage skips nothing and reorders nothing. Storage
ignores sequence numbers it already has, so every event is stored exactly once.

Each event is parsed through the engine's contract (engine.contract) once, while its batch is
prepared: the typed rows come from the parsed event, and the supervisor gets the parsed events
back from `poll`. An event the contract does not take (an unknown type, a missing or mistyped
field) is logged with the field it names and stored as it came; of its typed rows it gives
only a step event's metric points (every number it holds is charted, as before the contract).

The job supervisor (jobs.supervisor) drives one StreamIngest per job; `manage.py ingest`
runs the same loop as a process of its own.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import psycopg
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection, transaction
from django.db.models import Exists

from engine import contract
from jobs.models import Checkpoint, Job
from monitor import goodput, pushes
from monitor.models import Action, Anomaly, Event, ExpertLoad, MetricPoint, OpsSample, json_text

log = logging.getLogger(__name__)

GROUP = "ringside-ingest"
# events per channel-layer message: one group send per chunk, not per event, so a burst of a
# few thousand events costs a few Redis round trips; small enough that a chunk of `ops`
# events (a few KB each) stays well under a megabyte
FORWARD_CHUNK = 64
DEFAULT_CLAIM_IDLE_MS = 30_000
READ_COUNT = 500  # stream entries read per batch
SQL_PARAMETERS = 999  # a statement's parameters at most: SQLite's oldest limit
# reads the next batch of each StreamIngest while it stores the current one
_READ_AHEAD = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ingest-read-ahead")
# an action event's fields that are columns of its row; the rest is the row's `details`
ACTION_NOT_DETAILS = frozenset({*contract.Header, "action", "by", "command", "anomaly"})

E = TypeVar("E", bound=contract.Event)


def job_group(job_id: int) -> str:
    """The channel-layer group that a job's websocket clients join."""
    return f"job-{job_id}"


def _number(value: Any) -> float | None:
    """A finite float, or None for NaN/inf (spelled as strings in events) and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def step_metrics(event: dict[str, Any]) -> dict[str, float | None]:
    """The numeric fields of a step event, nested objects flattened as `memory.rss_bytes`;
    a list holds one value per rank: `system.cpu_percent: [a, b]` gives
    `system.cpu_percent.rank0` and `system.cpu_percent.rank1`."""
    skip = set(contract.Header)
    metrics: dict[str, float | None] = {}

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                visit(f"{prefix}{key}.", inner)
        elif isinstance(value, list):
            for rank, inner in enumerate(value):
                visit(f"{prefix}rank{rank}.", inner)
        elif isinstance(value, bool):
            return
        elif isinstance(value, int | float):
            metrics[prefix[:-1]] = _number(value)
        elif isinstance(value, str) and value in ("nan", "inf", "-inf"):
            metrics[prefix[:-1]] = None  # the event log spells non-finite floats as strings

    for key, value in event.items():
        if key not in skip:
            visit(f"{key}.", value)
    return metrics


def _latest_per_step(events: list[contract.Event], kind: type[E]) -> list[E]:
    """Of the events of `kind`, the latest (highest seq) for each step: a step trained again
    (after a restart or a rollback) replaces its earlier values."""
    latest: dict[int, E] = {}
    for e in events:
        if isinstance(e, kind):
            latest[e.step] = e  # events arrive sorted by seq
    return list(latest.values())


@dataclass
class Batch:
    """Events sorted by seq: as published (`events`, which are stored and forwarded), and
    parsed (`parsed`: those that keep the contract), with the rows they are stored as (by
    model) and their last step."""

    events: list[dict[str, Any]]
    parsed: list[contract.Event]
    rows: dict[type, list[tuple]]
    live_step: int | None  # where the batch leaves the live branch (None: it does not say)


def prepare(job_id: int, events: Iterable[Any]) -> Batch:
    """The rows that storing `events` writes, built before the transaction that writes them
    (the ingest builds the next batch's while it stores this one). Each event is parsed once,
    here; one the contract does not take is logged and stored as it came."""
    events = sorted((e for e in events if _has_seq(job_id, e)), key=lambda e: e["seq"])
    parsed = [p for p in (_parsed(job_id, e) for e in events) if p is not None]
    return Batch(events, parsed, _rows(job_id, events, parsed), _live_step(events))


def _live_step(events: list[dict[str, Any]]) -> int | None:
    """The batch's last word on the live branch's step: a step or state event's step, or a
    later rollback's `to_step` (the branch went back there). Not any event's: a checkpoint
    persisted in the background, say, names an older step than the one training is at. Read
    from the events as published, so a step event the contract does not take still counts."""
    live = None
    for e in events:
        if e.get("type") in (contract.StepEvent.type, contract.StateEvent.type):
            live = _integer(e.get("step"))
        elif (e.get("type") == contract.ActionEvent.type
              and e.get("action") == contract.CommandKind.ROLLBACK
              and isinstance(e.get("to_step"), int)):
            live = _integer(e["to_step"])
    return live


def _has_seq(job_id: int, event: Any) -> bool:
    """Whether `event` can be stored at all: an object with its sequence number."""
    if isinstance(event, dict) and _integer(event.get("seq")):
        return True
    log.error("job %s: event without a sequence number skipped: %.200r", job_id, event)
    return False


def _parsed(job_id: int, event: dict[str, Any]) -> contract.Event | None:
    try:
        return contract.parse_event(event)
    except contract.ContractError as error:
        log.warning("job %s: event %s stored as it came, not as the contract has it: %s", job_id,
                    event["seq"], error)
        return None


def _integer(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _rows(job_id: int, events: list[dict[str, Any]],
          parsed: list[contract.Event]) -> dict[type, list[tuple]]:
    """The rows of a batch, by model: each event's own, as published (`events`, sorted by
    seq), then the typed rows drawn from the parsed events."""
    by_step_metrics = {
        # every number a step event holds is a series, whatever else it holds or lacks
        (name[:64], _integer(e.get("step"))): value
        for e in events if e.get("type") == contract.StepEvent.type
        for name, value in step_metrics(e).items()
    }
    rows: dict[type, list[tuple]] = {
        Event: [(job_id, e["seq"], str(e.get("type"))[:16], _integer(e.get("step")),
                 _number(e.get("time")) or 0.0, json_text(e)) for e in events],
        MetricPoint: [(job_id, name, step, value)
                      for (name, step), value in by_step_metrics.items()],
        OpsSample: [(job_id, e.step, e.seq, _number(e.step_ms), _number(e.void_share),
                     _number(e.data_wait_share))
                    for e in _latest_per_step(parsed, contract.OpsEvent)],
        ExpertLoad: [_expert_load(job_id, e)
                     for e in _latest_per_step(parsed, contract.ExpertsEvent)],
        Anomaly: [],
        Action: [],
        Checkpoint: [],
    }
    for e in parsed:
        at = (job_id, e.seq, e.step, e.time)
        if isinstance(e, contract.AnomalyEvent):
            rows[Anomaly].append((*at, e.kind[:32], e.severity[:16], e.rank,
                                  json_text(e.evidence)))
        elif isinstance(e, contract.ActionEvent):
            details = {k: v for k, v in e.to_dict().items() if k not in ACTION_NOT_DETAILS}
            rows[Action].append((*at, e.action[:32], (e.by or "")[:16], (e.command or "")[:64],
                                 (e.anomaly or "")[:32], json_text(details)))
        elif isinstance(e, contract.CheckpointEvent):
            rows[Checkpoint].append((*at, e.path[:1024], e.tier[:16], e.size_bytes,
                                     e.strategy[:8], e.world_size, _number(e.blocking_s),
                                     None if e.lineage is None else json_text(e.lineage)))
    return rows


def _expert_load(job_id: int, e: contract.ExpertsEvent) -> tuple:
    violations = [v for v in (_number(layer.get("max_violation")) for layer in e.layers)
                  if v is not None]
    return (job_id, e.step, e.seq, max(violations, default=None),
            sum(int(layer.get("dead_experts", 0)) for layer in e.layers))


# the columns of the typed rows that `_rows` builds after (job_id, seq, step, time)
EVENT_ROW_COLUMNS = {
    Anomaly: ("kind", "severity", "rank", "evidence"),
    Action: ("action", "by", "command", "anomaly", "details"),
    Checkpoint: ("path", "tier", "size_bytes", "strategy", "world_size", "blocking_s",
                 "lineage"),
}


def _insert(model: type, columns: tuple[str, ...], rows: list[tuple], on_conflict: str) -> None:
    """INSERT rows of plain values into `model`'s table.
    Plain SQL rather than bulk_create for the rows every event or step gives (events, metric
    points): building a model instance for each cost more than the database's work. On
    PostgreSQL the rows go in one statement as one binary array per column (`unnest`), bound
    on the server. Django's cursors bind on the client, spelling every value into the SQL
    text, which the driver then spends longer composing and the server parsing than storing
    the rows: the events went in 7x slower that way. On SQLite (3.24+) they go as VALUES
    lists, some hundreds a statement."""
    if not rows:
        return
    quote = connection.ops.quote_name
    into = f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(map(quote, columns))})"
    types = ["bigint" if c.endswith("_id") else model._meta.get_field(c).db_type(connection)
             for c in columns]
    if connection.vendor == "postgresql":
        # a JSON document travels as text and becomes json per row (faster than a json[])
        arrays = ", ".join(f"%b::{'text' if t in ('json', 'jsonb') else t}[]" for t in types)
        names = [f"c{i}" for i in range(len(columns))]
        values = ", ".join(f"{n}::{t}" for n, t in zip(names, types, strict=True))
        connection.ensure_connection()
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(f"{into} SELECT {values} FROM unnest({arrays}) AS u({', '.join(names)})"
                           f" ON CONFLICT {on_conflict}",
                           [list(column) for column in zip(*rows, strict=True)])
        return
    per_statement = SQL_PARAMETERS // len(columns)
    row_sql = f"({', '.join(['%s'] * len(columns))})"
    with connection.cursor() as cursor:
        for start in range(0, len(rows), per_statement):
            chunk = rows[start:start + per_statement]
            cursor.execute(f"{into} VALUES {', '.join([row_sql] * len(chunk))} "
                           f"ON CONFLICT {on_conflict}",
                           [value for row in chunk for value in row])


def _upsert_per_step(model: type, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """Rows of (job_id, step, seq, *columns); a step stored again takes the newer event's."""
    quote = connection.ops.quote_name
    _insert(model, ("job_id", "step", "seq", *columns), rows,
            on_conflict="(job_id, step) DO UPDATE SET " + ", ".join(
                f"{quote(c)} = excluded.{quote(c)}" for c in ("seq", *columns)))


def store_events(job_id: int, events: Iterable[dict[str, Any]]) -> None:
    """Write events and their typed rows in one transaction; duplicates are no-ops."""
    write(job_id, prepare(job_id, events))


def write(job_id: int, batch: Batch) -> None:
    """Store a prepared batch in one transaction; duplicates are no-ops."""
    if not batch.events:
        return
    rows = batch.rows
    with transaction.atomic():
        _insert(Event, ("job_id", "seq", "type", "step", "time", "data"), rows[Event],
                on_conflict="(job_id, seq) DO NOTHING")
        _insert(MetricPoint, ("job_id", "name", "step", "value"), rows[MetricPoint],
                on_conflict="(job_id, name, step) DO UPDATE SET value = excluded.value")
        _upsert_per_step(OpsSample, ("step_ms", "void_share", "data_wait_share"),
                         rows[OpsSample])
        _upsert_per_step(ExpertLoad, ("max_violation", "dead_experts"), rows[ExpertLoad])
        for model, columns in EVENT_ROW_COLUMNS.items():
            _insert(model, ("job_id", "seq", "step", "time", *columns), rows[model],
                    on_conflict="(job_id, seq) DO NOTHING")
        # the live branch's step, unless this is a replay of an older batch (newer is stored)
        if batch.live_step is not None:
            newer = Event.objects.filter(job_id=job_id, seq__gt=batch.events[-1]["seq"])
            Job.objects.filter(pk=job_id).exclude(Exists(newer)).update(step=batch.live_step)
        # after the job's row: a transition locks it, then the ledger's (monitor.goodput)
        goodput.fold_events(job_id, batch.parsed)


def forward(job_id: int, messages: list[dict[str, Any]]) -> None:
    """Send messages (JSON-ready dicts with `type` and `seq`) to the job's websocket clients,
    in order, a chunk of them per channel-layer message."""
    if not messages:
        return
    layer = get_channel_layer()

    async def send_all() -> None:
        for start in range(0, len(messages), FORWARD_CHUNK):
            await layer.group_send(job_group(job_id), {
                "type": "job.events", "events": messages[start:start + FORWARD_CHUNK]})

    try:
        async_to_sync(send_all)()
    except (redis.ConnectionError, redis.TimeoutError) as error:
        # best effort: what the clients missed they get on reconnecting with ?after=<seq>
        log.warning("job %s: %d messages not forwarded, the channel layer is unreachable (%s)",
                    job_id, len(messages), error)


class StreamIngest:
    def __init__(self, job_id: int, client: redis.Redis, consumer: str = "supervisor",
                 claim_idle_ms: int = DEFAULT_CLAIM_IDLE_MS):
        self.job_id = job_id
        self.client = client
        self.consumer = consumer
        self.claim_idle_ms = claim_idle_ms
        self.stream = contract.events_stream(str(job_id))
        self.last_seq = 0
        self._recovering = True  # first re-read our delivered-but-unacknowledged entries
        self._next: Future[tuple[list, Batch]] | None = None
        self._create_group()
        self._claim_abandoned()
        # What this process holds now (Django, torch's modules) lives for good. Parsing a
        # batch makes thousands of dicts, and the collections they set off walked all of
        # that again and again: a third of the ingest's time before the freeze.
        gc.freeze()

    def _create_group(self) -> None:
        try:
            self.client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _claim_abandoned(self) -> None:
        """Take over what other consumers of the group read but never acknowledged (they
        crashed), so it is re-read with ours."""
        start = "0-0"
        while True:
            # (not JUSTID: redis-py then drops the cursor from the reply)
            start = self.client.xautoclaim(self.stream, GROUP, self.consumer,
                                           min_idle_time=self.claim_idle_ms, start_id=start,
                                           count=1000)[0]
            if start in (b"0-0", "0-0"):
                return

    def poll(self, block_ms: int | None = 500, count: int = READ_COUNT) -> list[contract.Event]:
        """Store, acknowledge and forward the next batch; return its events that keep the
        contract, parsed (maybe none).

        Waits up to `block_ms` for new events; None returns at once. While a batch is being
        stored, the next one is already read (another thread; the database call releases
        the GIL): it is delivered to this consumer but acknowledged only when a later poll
        has stored it, so a crash in between leaves it to be re-read like any other.
        """
        return self._store_next(block_ms, count).parsed

    def _store_next(self, block_ms: int | None, count: int) -> Batch:
        try:
            ids, batch = self._next.result() if self._next is not None else ([], None)
            self._next = None
            if not ids:
                ids, batch = self._read(block_ms, count)
            if ids and not self._recovering:
                self._next = _READ_AHEAD.submit(self._read, None, count)
            write(self.job_id, batch)
            if ids:
                self.client.xack(self.stream, GROUP, *ids)
        except Exception:
            self._read_again()
            raise
        if batch.events:
            self.last_seq = max(self.last_seq, batch.events[-1]["seq"])
            forward(self.job_id, batch.events)
            forward(self.job_id, [goodput.message(self.job_id, self.last_seq),
                                  *pushes.after_batch(self.job_id, batch.parsed, self.last_seq)])
        return batch

    def _read_again(self) -> None:
        """After a failed poll (the bus or the database went away): the next poll starts
        from this consumer's unacknowledged entries, in order, so the failed batch and the
        one read ahead of it are stored before anything newer."""
        if self._next is not None:
            wait([self._next])
            self._next = None
        self._recovering = True

    def _read(self, block_ms: int | None, count: int) -> tuple[list, Batch]:
        """The next entries delivered to this consumer: their ids, and their events prepared
        for storage. Recovering, that is what was delivered before and never acknowledged;
        then new ones."""
        while True:
            start = "0" if self._recovering else ">"
            try:
                reply = self.client.xreadgroup(
                    GROUP, self.consumer, {self.stream: start}, count=count,
                    block=None if self._recovering else block_ms,
                )
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                # the bus came back without its data: follow the stream from its start again
                self._create_group()
                continue
            entries = reply[0][1] if reply else []
            if not (self._recovering and not entries):
                break
            self._recovering = False
        ids, events = [], []
        for entry_id, fields in entries:
            ids.append(entry_id)
            raw = contract.entry_field(fields, contract.StreamField.EVENT)
            try:
                events.append(orjson.loads(raw))
            except (TypeError, ValueError):
                log.error("job %s: unreadable event %s in %s skipped", self.job_id, entry_id,
                          self.stream)
        return ids, prepare(self.job_id, events)

    def drain(self) -> list[contract.Event]:
        """Everything still in the stream, without waiting for more (as `poll` returns it)."""
        drained = []
        while (batch := self._store_next(block_ms=None, count=READ_COUNT)).events:
            drained.extend(batch.parsed)
        return drained
