"""All ranks agree: anomalies found on any rank reach every rank with their evidence, and
the ladder then decides the same actions everywhere. Four real gloo ranks."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from engine.anomaly import Detectors, ResponseLadder, agree_anomalies
from tests.engine.ranks import run_ranks

WORLD, NAN_RANK, NAN_STEP = 4, 3, 5


def rank_main() -> list[dict]:
    rank = dist.get_rank()
    detectors, ladder = Detectors(rank=rank), ResponseLadder()
    log = []
    for step in range(1, 9):
        loss = 3.0 - 0.01 * step + 0.001 * rank  # each rank's own micro-batch loss
        if rank == NAN_RANK and step in (NAN_STEP, NAN_STEP + 1):
            loss = float("nan")
        agreed, now = agree_anomalies(detectors.check_step(step, loss=loss))
        decisions = ladder.decide(agreed, step, now)
        log.append({"step": step, "now": now,
                    "anomalies": [[a.kind, a.rank, a.evidence] for a in agreed],
                    "actions": [d.event_fields() for d in decisions]})
    return json.loads(json.dumps(log))  # as the event log would carry it (NaN evidence too)


@pytest.fixture(scope="module")
def logs():
    return run_ranks(rank_main, procs_per_node=WORLD, timeout_s=120)


def test_every_rank_sees_the_same_anomalies_clock_and_decisions(logs):
    assert all(log == logs[0] for log in logs)


def test_an_anomaly_on_one_rank_reaches_all_with_its_rank_and_evidence(logs):
    by_step = {entry["step"]: entry for entry in logs[0]}
    assert by_step[NAN_STEP]["anomalies"] == [
        ["nan", NAN_RANK, {"loss": "nan", "threshold": "finite"}]]
    assert [a["action"] for a in by_step[NAN_STEP]["actions"]] == ["skip_update"]
    assert [a["action"] for a in by_step[NAN_STEP + 1]["actions"]] == ["rollback"]
    quiet = [e for s, e in by_step.items() if s not in (NAN_STEP, NAN_STEP + 1)]
    assert all(e["anomalies"] == [] and e["actions"] == [] for e in quiet)
