"""The anomaly record and its event fields."""

from __future__ import annotations

import pytest

from engine.anomaly import Anomaly, crash_anomaly


def test_event_fields_carry_kind_severity_rank_and_evidence():
    a = Anomaly("loss_spike", "error", 12, 1, {"value": 40.0, "z_threshold": 3.0})
    assert a.event_fields() == {"kind": "loss_spike", "severity": "error", "rank": 1,
                                "evidence": {"value": 40.0, "z_threshold": 3.0}}


def test_crash_names_rank_and_exit_code():
    a = crash_anomaly(30, 2, -9, signal="SIGKILL")
    assert (a.kind, a.severity, a.rank) == ("crash", "critical", 2)
    assert a.evidence == {"exit_code": -9, "signal": "SIGKILL"}


def test_unknown_kind_or_severity_names_the_field():
    with pytest.raises(ValueError, match="kind"):
        Anomaly("oom", "error", 1)
    with pytest.raises(ValueError, match="severity"):
        Anomaly("nan", "fatal", 1)
