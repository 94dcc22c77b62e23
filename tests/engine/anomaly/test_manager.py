"""FaultManager: the loop's one call per step (single process; agreement across real ranks
is in test_agree.py)."""

from __future__ import annotations

import threading

from engine.anomaly import Anomaly, FaultManager
from engine.anomaly.policy import FaultPolicy


def test_quiet_steps_decide_nothing():
    faults = FaultManager()
    for step in range(1, 30):
        assert faults.step(step, loss=3.0 - 0.01 * step, grad_norm=1.0) == ([], [])


def test_a_nan_loss_is_answered_in_its_step():
    faults = FaultManager(rank=0)
    faults.step(1, loss=3.0)
    anomalies, decisions = faults.step(2, loss=float("nan"))
    assert [a.kind for a in anomalies] == ["nan"]
    assert [(d.action, d.anomaly) for d in decisions] == [("skip_update", "nan")]


def test_anomalies_reported_from_another_thread_join_the_next_step():
    faults = FaultManager(FaultPolicy(actions={"hang": ["pause"]}), rank=1)
    hang = Anomaly("hang", "critical", 4, 1, {"op": "grad_sync", "timeout_s": 300.0})
    thread = threading.Thread(target=faults.report, args=(hang,))
    thread.start()
    thread.join()
    anomalies, decisions = faults.step(5, loss=2.0)
    assert anomalies == [hang]
    assert [d.action for d in decisions] == ["pause"]
    assert faults.step(6, loss=2.0) == ([], [])


def test_timing_and_expert_signals_are_checked_when_given():
    faults = FaultManager()
    rows = {"ranks": [{"rank": r, "compute_ms": 300.0 if r == 1 else 100.0, "comm_ms": 10.0}
                      for r in range(2)]}
    found = []
    for step in range(1, 20):  # the straggler detector skips 10 warm-up steps
        found += faults.step(step, aggregate=rows)[0]
    assert [(a.kind, a.rank) for a in found] == [("straggler", 1)]


def test_rollback_restores_detectors_but_keeps_the_live_ladder():
    faults = FaultManager()
    faults.step(1, loss=3.0)
    saved = faults.state_dict()
    faults.step(2, loss=float("nan"))  # skip_update
    faults.load_state_dict(saved, ladder=False)
    _, decisions = faults.step(3, loss=float("nan"))
    assert decisions[0].action == "rollback"  # the second NaN in a row still escalates
    fresh = FaultManager()
    fresh.load_state_dict(saved)
    assert fresh.step(3, loss=float("nan"))[1][0].action == "skip_update"
