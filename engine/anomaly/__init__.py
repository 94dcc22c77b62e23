"""Anomaly detectors, cross-rank agreement, the response ladder and fault injection."""

from engine.anomaly.agree import agree_anomalies
from engine.anomaly.anomaly import KINDS, SEVERITIES, Anomaly, crash_anomaly
from engine.anomaly.detectors import DEFAULTS, Detectors, EwmaZ, policy_thresholds
from engine.anomaly.inject import INJECTED_CRASH_EXIT_CODE, FaultInjector
from engine.anomaly.ladder import (
    ACTIONS,
    DEFAULT_LADDERS,
    Decision,
    ResponseLadder,
    policy_ladders,
)
from engine.anomaly.manager import FaultManager, policy_errors

__all__ = [
    "ACTIONS", "DEFAULTS", "DEFAULT_LADDERS", "INJECTED_CRASH_EXIT_CODE", "KINDS", "SEVERITIES",
    "Anomaly", "Decision", "Detectors", "EwmaZ", "FaultInjector", "FaultManager", "ResponseLadder",
    "agree_anomalies", "crash_anomaly", "policy_errors", "policy_ladders", "policy_thresholds",
]
