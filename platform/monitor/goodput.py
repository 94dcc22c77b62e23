"""The goodput ledger: a job's wall-clock time split into productive training and each cause
of loss, from its stored events and state transitions.

The wall clock runs from the job's creation to its final state (or now). Every second of it
goes to exactly one cause, so productive + losses = wall:

- `queue`: queued or waiting for hosts (placement);
- `startup`: from a supervisor taking the job to the engine's `running` state (launch,
  rendezvous, model build, checkpoint load), and from the engine's `completed` or
  `cancelled` state to the job's final one (shut-down);
- `checkpoint`: the blocking part of each checkpoint (`blocking_s` of its event);
- `recovery`: from a crash (the `crash` anomaly, a `restart` action, a `failed` engine, a
  requeue after a lost worker or host or by the platform's policy) until the engine runs
  again, queueing and start-up included;
- `retrained`: steps trained again after a rollback or a restart (a step event whose step is
  not beyond the highest one trained before);
- `skipped`: the steps whose update the fault policy dropped (skip_update, retry_step,
  rollback), up to its `action` event;
- `straggler`: per step, how much longer the slowest rank's compute took than the median of
  the other ranks' (its `ops` event): the time they waited for it, taken out of that step;
- `data`: per step, the time it waited on its next batch (the `ops` event's data-wait share of
  the step), taken out of that step;
- `pause`: from the engine carrying out a pause (its `pause` action) until it runs again
  (warm) or until the job is queued again (cold);
- `eval`: what an evaluated step's interval took beyond its `step_time`;
- `productive`: the rest of each step's interval: from the previous boundary (step,
  checkpoint, the engine's `running`) to its step event.

`Ledger` is a fold over `Mark`s (one per event or transition that matters) in time order,
kept as JSON: the ingest folds each stored batch into it and every transition is folded as it
is made, so the stored ledger is always current, and `view` adds the open interval up to now
(to the cause it is accruing to). `build` folds a whole history at once; both ways give the
same ledger. Each cause keeps the sequence numbers of the events and the ids of the state
transitions behind it (the newest `MAX_REFS`). Seconds are also kept per UTC hour, so a
summary over a time range counts only the hours within it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import IntegrityError, transaction

from engine import contract
from engine.contract import FINAL_STATES, ActionBy, ActionName, AnomalyKind, JobState
from jobs.models import Job, JobEvent
from monitor.models import Event, Goodput

CAUSES: dict[str, str] = {
    "productive": "productive training",
    "queue": "queueing and placement",
    "startup": "start-up, rendezvous and shut-down",
    "checkpoint": "checkpoint blocking",
    "recovery": "restarts and recovery",
    "retrained": "steps trained again",
    "skipped": "skipped or retried updates",
    "straggler": "straggler wait",
    "data": "waiting on data",
    "pause": "pauses",
    "eval": "evaluation",
}
LOSSES = tuple(c for c in CAUSES if c != "productive")
MAX_REFS = 100  # event seqs and transition ids kept per cause, newest
HOUR = 3600
# requeues that follow a failure: what comes until the engine runs again is recovery
RECOVERY_CAUSES = frozenset({"worker_loss", "host_loss", "policy"})
# the policy's answers that drop the step's update (a rerun drops the first pass at least:
# the rerun's result is kept when the spike was the step's, neither when it was the batch's)
DROPPING = frozenset({ActionName.SKIP_UPDATE, ActionName.RETRY_STEP, ActionName.RERUN,
                      ActionName.ROLLBACK})
# the job states that begin a phase without an engine (or end one): the others are made
# while an engine runs, whose own events say more precisely what it does
_PHASES = frozenset({JobState.QUEUED, JobState.WAITING_FOR_HOSTS, JobState.STARTING,
                     JobState.PAUSED}) | FINAL_STATES


@dataclass(frozen=True)
class Mark:
    """One point of the timeline: an engine event (`seq`) or a state transition (`transition`,
    the JobEvent's id). `kind` is the event type, or "transition"; the other fields are those
    of the kind that the ledger reads."""

    time: float
    kind: str
    seq: int = 0
    transition: int = 0
    state: str = ""  # a state event's or transition's new state
    cause: str = ""  # a transition's cause
    step: int = 0
    step_time: float = 0.0
    evaluated: bool = False
    blocking_s: float = 0.0
    action: str = ""
    by: str = ""
    wait_s: float = 0.0  # an ops event's straggler wait
    data_s: float = 0.0  # an ops event's wait on data

    @property
    def ref(self) -> tuple[str, int]:
        """What a cause lists it under: ("transitions", id) or ("events", seq)."""
        if self.kind == "transition":
            return "transitions", self.transition
        return "events", self.seq


def straggler_wait(ranks: list[dict[str, Any]]) -> float:
    """Seconds the step waited for its slowest rank's compute: its compute_ms over the median
    of the other ranks' (0 on one rank)."""
    compute = sorted(float(r.get("compute_ms") or 0.0) for r in ranks if isinstance(r, dict))
    if len(compute) < 2:
        return 0.0
    return max(0.0, compute[-1] - statistics.median(compute[:-1])) / 1000.0


def event_mark(event: contract.Event) -> Mark | None:
    """The mark of a parsed engine event, or None when the ledger does not read it."""
    at = {"time": event.time, "kind": event.type, "seq": event.seq, "step": event.step}
    if isinstance(event, contract.StepEvent):
        return Mark(**at, step_time=event.step_time, evaluated=event.eval_loss is not None)
    if isinstance(event, contract.OpsEvent):
        return Mark(**at, wait_s=straggler_wait(event.ranks),
                    data_s=max(0.0, event.data_wait_share) * max(0.0, event.step_ms) / 1000.0)
    if isinstance(event, contract.CheckpointEvent):
        return Mark(**at, blocking_s=max(0.0, event.blocking_s))
    if isinstance(event, contract.StateEvent):
        return Mark(**at, state=event.state)
    if isinstance(event, contract.ActionEvent):
        return Mark(**at, action=event.action, by=event.by or "")
    if isinstance(event, contract.AnomalyEvent) and event.kind == AnomalyKind.CRASH:
        return Mark(**at, action=AnomalyKind.CRASH)
    return None


def transition_mark(row_id: int, time: float, to_state: str, cause: str) -> Mark | None:
    """The mark of a state transition, or None for one made while an engine runs."""
    if to_state not in _PHASES:
        return None
    return Mark(time=time, kind="transition", transition=row_id, state=to_state, cause=cause)


@dataclass
class Ledger:
    """The fold's state: the seconds so far up to `cursor`, what the time after it accrues
    to (`mode`), the highest step trained (`high`) and the last step's share (for its
    straggler wait, known from the `ops` event after it)."""

    start: float
    cursor: float = 0.0
    mode: str = "queue"
    high: int = 0
    closed: bool = False
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    refs: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    hours: dict[str, dict[str, float]] = field(default_factory=dict)
    last_step: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cursor = self.cursor or self.start

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ledger:
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # -- booking ------------------------------------------------------------------------
    def _book(self, cause: str, seconds: float, at: float, ref: tuple[str, int] | None) -> None:
        """`seconds` to `cause` (negative: taken back), counted in the hour of `at`."""
        if seconds == 0:
            return
        self.seconds[cause] += seconds
        hour = self.hours.setdefault(str(int(at // HOUR) * HOUR), {})
        hour[cause] = hour.get(cause, 0.0) + seconds
        if ref is not None and seconds > 0:
            self._refer(cause, ref)

    def _refer(self, cause: str, ref: tuple[str, int]) -> None:
        """List `ref` under `cause` (once: marks come in order, so a repeat is the last one),
        keeping the newest MAX_REFS."""
        kind, ident = ref
        kept = self.refs.setdefault(cause, {}).setdefault(kind, [])
        if not kept or kept[-1] != ident:
            kept.append(ident)
            del kept[:-MAX_REFS]

    def _spend(self, cause: str, until: float, ref: tuple[str, int] | None) -> None:
        """The interval from the cursor to `until`, to `cause`, split at hour boundaries."""
        if ref is not None:
            self._refer(cause, ref)
        start = self.cursor
        while start < until:
            end = min(until, (start // HOUR + 1) * HOUR)
            self._book(cause, end - start, start, None)
            start = end
        self.cursor = max(self.cursor, until)

    def _move(self, cause: str, seconds: float, to: str, at: float,
              ref: tuple[str, int]) -> None:
        """Re-book `seconds` booked to `cause` in the hour of `at` to `to`."""
        self._book(cause, -seconds, at, None)
        self._book(to, seconds, at, ref)

    @property
    def accruing(self) -> str:
        """The cause the time after the cursor accrues to: the mode's, or while the engine
        trains, the last step's (productive, or retrained)."""
        return self.last_step.get("cause", "productive") if self.mode == "train" else self.mode

    # -- the fold -----------------------------------------------------------------------
    def fold(self, marks: Iterable[Mark]) -> Ledger:
        """Advance over `marks` (in time order); a mark earlier than the cursor (stored late)
        spans no time."""
        for mark in marks:
            if self.closed:
                break
            if not math.isfinite(mark.time):
                continue
            if mark.kind == "transition":
                self._transition(mark)
            elif mark.kind == "ops":
                self._ops(mark)
            elif mark.kind == "step":
                self._step(mark)
            elif mark.kind == "checkpoint":
                self._checkpoint(mark)
            elif mark.kind == "state":
                self._state(mark)
            else:
                self._action(mark)
        return self

    def _transition(self, mark: Mark) -> None:
        # a lost worker or host: what it did since its last stored event is lost with it
        lost = mark.cause in RECOVERY_CAUSES and mark.state == JobState.QUEUED
        self._spend("recovery" if lost else self.accruing, mark.time, mark.ref)
        if mark.state in FINAL_STATES:
            self.closed = True
        elif mark.state == JobState.QUEUED:
            self.mode = "recovery" if mark.cause in RECOVERY_CAUSES else "queue"
        elif mark.state == JobState.PAUSED:
            self.mode = "pause"
        elif self.mode != "recovery":  # starting, waiting_for_hosts
            self.mode = "startup" if mark.state == JobState.STARTING else "queue"

    def _step(self, mark: Mark) -> None:
        interval = max(0.0, mark.time - self.cursor)
        evaluation = max(0.0, interval - mark.step_time) if mark.evaluated else 0.0
        cause = "retrained" if mark.step <= self.high else "productive"
        self.high = max(self.high, mark.step)
        self._book("eval", evaluation, mark.time, mark.ref)
        self._book(cause, interval - evaluation, mark.time, mark.ref)
        self.cursor = max(self.cursor, mark.time)
        self.last_step = {"cause": cause, "step": mark.step, "seconds": interval - evaluation,
                          "time": mark.time}
        self.mode = "train"

    def _ops(self, mark: Mark) -> None:
        """Take the step's waits (on a straggler, on data) out of the time its step booked."""
        last = self.last_step
        if last.get("step") != mark.step:
            return
        for cause, wait in (("straggler", mark.wait_s), ("data", mark.data_s)):
            moved = min(wait, last.get("seconds", 0.0))
            if moved > 0:
                last["seconds"] -= moved
                self._move(last["cause"], moved, cause, last["time"], mark.ref)

    def _checkpoint(self, mark: Mark) -> None:
        interval = max(0.0, mark.time - self.cursor)
        blocking = min(mark.blocking_s, interval)
        self._book("checkpoint", blocking, mark.time, mark.ref)
        self._book(self.accruing, interval - blocking, mark.time, None)
        self.cursor = max(self.cursor, mark.time)

    def _state(self, mark: Mark) -> None:
        if mark.state == JobState.RUNNING:
            self._spend(self.accruing, mark.time, mark.ref)
            self.mode = "train"
        elif mark.state == JobState.PAUSED:
            self._spend("pause", mark.time, mark.ref)
            self.mode = "pause"
        elif mark.state in (JobState.COMPLETED, JobState.CANCELLED):
            self._spend("startup", mark.time, mark.ref)
            self.mode = "startup"
        elif mark.state == JobState.FAILED:
            self._spend("recovery", mark.time, mark.ref)
            self.mode = "recovery"
        elif mark.state == JobState.RESHARDING:
            self._spend(self.accruing, mark.time, mark.ref)
            self.mode = "startup"

    def _action(self, mark: Mark) -> None:
        if mark.action in (AnomalyKind.CRASH, ActionName.RESTART):
            self._spend("recovery", mark.time, mark.ref)
            self.mode = "recovery"
        elif mark.action in DROPPING and mark.by == ActionBy.POLICY:
            self._spend("skipped", mark.time, mark.ref)
        elif mark.action == ActionName.ROLLBACK:  # a person's: the reload
            self._spend("recovery", mark.time, mark.ref)
        elif mark.action == ActionName.PAUSE:
            self._spend("pause", mark.time, mark.ref)
            self.mode = "pause"

    # -- reading ------------------------------------------------------------------------
    def open_cause(self) -> str | None:
        """The cause the time after the cursor accrues to (None once the job is final)."""
        return None if self.closed else self.accruing

    def view(self, now: float) -> dict[str, Any]:
        """Seconds, shares and references per cause, with the open interval up to `now`."""
        seconds = dict(self.seconds)
        open_cause = self.open_cause()
        if open_cause is not None:
            seconds[open_cause] += max(0.0, now - self.cursor)
        end = self.cursor if self.closed else max(now, self.cursor)
        wall = end - self.start
        return {
            "start": self.start, "end": end, "wall_s": wall, "closed": self.closed,
            "productive_s": seconds["productive"],
            "goodput": seconds["productive"] / wall if wall > 0 else None,
            "open": open_cause,
            "causes": {cause: {"label": label, "seconds": seconds[cause],
                               "share": seconds[cause] / wall if wall > 0 else 0.0,
                               "events": self.refs.get(cause, {}).get("events", []),
                               "transitions": self.refs.get(cause, {}).get("transitions", [])}
                       for cause, label in CAUSES.items()},
        }

    def within(self, since: float, until: float, now: float) -> dict[str, float]:
        """Seconds per cause in the whole UTC hours from `since` to `until`, the open interval
        up to `now` included."""
        totals = dict.fromkeys(CAUSES, 0.0)
        for hour, causes in self.hours.items():
            if since <= float(hour) and float(hour) + HOUR <= until:
                for cause, seconds in causes.items():
                    totals[cause] += seconds
        open_cause = self.open_cause()
        if open_cause is not None:
            totals[open_cause] += max(0.0, min(now, until) - max(self.cursor, since))
        return totals


def build(start: float, marks: Iterable[Mark]) -> Ledger:
    """The ledger of a history from `start` (the job's creation): `marks` in any order."""
    return Ledger(start=start).fold(sorted(marks, key=lambda m: (m.time, m.transition, m.seq)))


# -- stored with the job -------------------------------------------------------------------
# the event types that give marks (the others are not read back to rebuild a ledger)
MARKED_TYPES = ("step", "ops", "checkpoint", "state", "action", "anomaly")


def stored_marks(job_id: int) -> list[Mark]:
    """The marks of a job's stored events and state transitions."""
    marks = [transition_mark(pk, time.timestamp(), to_state, cause) for pk, time, to_state, cause
             in JobEvent.objects.filter(job_id=job_id).values_list("pk", "time", "to_state",
                                                                  "cause")]
    for data in (Event.objects.filter(job_id=job_id, type__in=MARKED_TYPES).order_by("seq")
                 .values_list("data", flat=True).iterator(chunk_size=500)):
        try:
            marks.append(event_mark(contract.parse_event(data)))
        except contract.ContractError:
            continue  # stored as it came (monitor.ingest): it says nothing the ledger reads
    return [m for m in marks if m is not None]


def rebuild(job_id: int) -> Ledger:
    """The ledger of everything stored for the job, folded afresh."""
    created = Job.objects.values_list("created_at", flat=True).get(pk=job_id)
    return build(created.timestamp(), stored_marks(job_id))


def _locked(job_id: int) -> tuple[Goodput, bool]:
    """The job's ledger row, locked for this transaction; made from what is stored (then
    True: it holds this transaction's own rows already) if the job had none."""
    row = Goodput.objects.select_for_update().filter(job_id=job_id).first()
    if row is not None:
        return row, False
    # the job's row first, as a transition and the ingest's step update lock it before they
    # fold: a new row's insert checks its job under a share lock, so a reader making the row
    # beside a transition that made it too would each wait on the other (a deadlock)
    Job.objects.select_for_update().filter(pk=job_id).exists()
    last = Event.objects.filter(job_id=job_id).order_by("-seq").values_list("seq", flat=True)
    try:
        with transaction.atomic():
            Goodput.objects.create(job_id=job_id, ledger=rebuild(job_id).to_dict(),
                                   last_seq=last.first() or 0)
        created = True
    except IntegrityError:  # made meanwhile by another transaction, without our rows
        created = False
    return Goodput.objects.select_for_update().get(job_id=job_id), created


def fold_events(job_id: int, events: list[contract.Event]) -> None:
    """Fold a stored batch of parsed events (sorted by seq) into the job's ledger, in the
    transaction that stored them; events folded before (redelivered) are skipped."""
    with transaction.atomic():
        row, fresh = _locked(job_id)
        new = [e for e in events if e.seq > row.last_seq]
        if fresh or not new:
            return
        ledger = Ledger.from_dict(row.ledger).fold(
            m for m in map(event_mark, new) if m is not None)
        row.ledger, row.last_seq = ledger.to_dict(), new[-1].seq
        row.save(update_fields=["ledger", "last_seq"])


def fold_transition(change: JobEvent) -> None:
    """Fold a state transition into the job's ledger, in the transaction that makes it."""
    mark = transition_mark(change.pk, change.time.timestamp(), change.to_state, change.cause)
    if mark is None:
        return
    with transaction.atomic():
        row, fresh = _locked(change.job_id)
        if not fresh:
            row.ledger = Ledger.from_dict(row.ledger).fold([mark]).to_dict()
            row.save(update_fields=["ledger"])


def stored(job_id: int) -> Ledger:
    """The job's current ledger (made from what is stored if the job has none yet)."""
    row = Goodput.objects.filter(job_id=job_id).first()
    if row is None:
        with transaction.atomic():
            row, _ = _locked(job_id)
    return Ledger.from_dict(row.ledger)


def of(job: Job) -> Ledger:
    """The ledger of `job`, from the row its query brought along (select_related("goodput"))
    if it did."""
    try:
        return Ledger.from_dict(job.goodput.ledger)
    except Goodput.DoesNotExist:
        return stored(job.pk)


def current(job_id: int, now: float | None = None) -> dict[str, Any]:
    """The job's ledger as the API serves it: up to `now` (default: the present)."""
    return {"job": job_id, **stored(job_id).view(time.time() if now is None else now)}


def message(job_id: int, seq: int) -> dict[str, Any]:
    """The `goodput` message of the job's websocket: the ledger now (`seq`: the socket's)."""
    return {"type": "goodput", "seq": seq, "goodput": current(job_id)}
