"""What a tracker is told about a job's events: numbers by step, notes, checkpoint links.

Every number of a step event is a series under the name the platform charts it by
(monitor.ingest.step_metrics: `loss`, `tokens_per_s`, `lr`, `grad_norm`, `source_loss.web`,
`eval_loss`, `eval_source_loss.web`, ...); a checkpoint's evaluation is series at its step
under `eval/` (`eval/heldout/web/loss`, `eval/heldout/web/perplexity`,
`eval/tasks/letters/accuracy`: every number of its task scores). Anomalies, actions and
state changes are notes (text at a step); a checkpoint is a link to its folder. An event
the contract does not take is left out, as is a non-finite number (the anomaly that reports
it is a note).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any

from engine import contract
from monitor.ingest import step_metrics
from monitor.models import json_text

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
NAME_PART_CHARS = 100


@dataclass(frozen=True)
class Scalars:
    step: int
    time: float
    values: dict[str, float]
    # a checkpoint's scores, at its step: they arrive after later training steps
    evaluation: bool = False


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
                                      contract.CheckpointEvent, contract.EvaluationEvent))


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
    if isinstance(e, contract.EvaluationEvent):
        return Scalars(e.step, e.time, evaluation_series(e), evaluation=True)
    return None


def evaluation_series(e: contract.EvaluationEvent) -> dict[str, float]:
    """The numbers of an evaluation's results by series name; a non-number (a task's kind) and
    a non-finite one are left out."""
    found = {f"eval/heldout/{_part(source)}/{_part(name)}": value
             for source, scores in e.heldout.items() for name, value in scores.items()}
    found |= {f"eval/tasks/{_part(task)}/{_part(name)}": value
              for task, scores in e.tasks.items() for name, value in scores.items()}
    return {name: float(value) for name, value in found.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value)}


def _part(name: str) -> str:
    # a task's name is the user's: MLflow refuses a metric name of other characters, and
    # a batch it refuses would hold the sink back for good
    return _UNSAFE.sub("_", name)[:NAME_PART_CHARS] or "_"
