"""What a tracker is told about a job's events: numbers by step, notes, checkpoint links.

Every number of a step event is a series under the name the platform charts it by
(monitor.ingest.step_metrics: `loss`, `tokens_per_s`, `lr`, `grad_norm`, `source_loss.web`,
`eval_loss`, `eval_source_loss.web`, ...). Anomalies, actions and state changes are notes (text
at a step); a checkpoint is a link to its folder. An event the contract does not take is left
out, as is a non-finite number (the anomaly that reports it is a note).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from engine import contract
from monitor.ingest import step_metrics
from monitor.models import json_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scalars:
    step: int
    time: float
    values: dict[str, float]


@dataclass(frozen=True)
class Note:
    step: int
    time: float
    tag: str  # "anomaly", "action" or "state"
    text: str


@dataclass(frozen=True)
class CheckpointLink:
    step: int
    time: float
    tier: str
    path: str


Record = Scalars | Note | CheckpointLink
# the event types a tracker is told about
TOLD = frozenset(cls.type for cls in (contract.StepEvent, contract.AnomalyEvent,
                                      contract.ActionEvent, contract.StateEvent,
                                      contract.CheckpointEvent))


def records(events: list[dict[str, Any]]) -> list[Record]:
    """The records of events as published (wire dicts), in their order."""
    found: list[Record] = []
    for event in events:
        if event.get("type") not in TOLD:
            continue  # not parsed at all: the per-op and expert-load events are most of a run's
        try:
            parsed = contract.parse_event(event)
        except contract.ContractError as error:
            log.warning("sink: event %s left out: %s", event.get("seq"), error)
            continue
        record = _record(event, parsed)
        if record is not None:
            found.append(record)
    return found


def _record(event: dict[str, Any], e: contract.Event) -> Record | None:
    if isinstance(e, contract.StepEvent):
        values = {name: value for name, value in step_metrics(event).items() if value is not None}
        return Scalars(e.step, e.time, values)
    if isinstance(e, contract.AnomalyEvent):
        rank = "" if e.rank is None else f" on rank {e.rank}"
        return Note(e.step, e.time, "anomaly",
                    f"{e.kind} ({e.severity}){rank}: {json_text(event.get('evidence', {}))}")
    if isinstance(e, contract.ActionEvent):
        why = e.reason or e.error or e.anomaly or ""
        return Note(e.step, e.time, "action",
                    f"{e.action} by {e.by or 'the engine'}" + (f": {why}" if why else ""))
    if isinstance(e, contract.StateEvent):
        return Note(e.step, e.time, "state", e.state)
    if isinstance(e, contract.CheckpointEvent):
        return CheckpointLink(e.step, e.time, e.tier, e.path)
    return None
