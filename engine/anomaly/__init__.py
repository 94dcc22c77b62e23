"""Anomaly detectors, cross-rank agreement, the response ladder, the fault policy and fault
injection. All but the agreement across ranks (agree.py, and the manager that runs it) is
torch-free: the platform validates the spec's `faults` with it."""

from engine.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "agree": ("agree_anomalies",),
    "anomaly": ("KINDS", "SEVERITIES", "Anomaly", "crash_anomaly"),
    "detectors": ("Detectors", "EwmaZ"),
    "inject": ("FAULT_KINDS", "INJECTED_CRASH_EXIT_CODE", "FaultInjection", "FaultInjector"),
    "ladder": ("Decision", "ResponseLadder"),
    "manager": ("FaultManager",),
    "policy": ("ACTIONS", "DEFAULTS", "DEFAULT_LADDERS", "LADDER_ACTIONS", "FaultPolicy",
               "policy_errors", "policy_ladders", "policy_thresholds"),
})
