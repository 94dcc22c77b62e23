"""The fault policy (`faults.policy` of the job spec) and its one validator.

Thresholds override DEFAULTS per anomaly kind and parameter; `actions` replaces a kind's
ladder in DEFAULT_LADDERS (see detectors.py and ladder.py for what they mean). The actions
in `approve` wait for a person (engine.runtime.approvals): `approve_timeout_s` later the run
takes `approve_default` ("proposed": the proposed action, or a named action; "pause" pauses),
and meanwhile it holds at the step boundary, or trains on (`approve_while: "observe"`). Errors name
the spec field, `faults.policy.<field>`, since the spec's validation reports them as its own.
Torch-free: the platform validates specs in its web processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.anomaly.anomaly import KINDS
from engine.contract import ActionName, AnomalyKind
from engine.errors import SpecError

DEFAULTS: dict[str, dict[str, float]] = {
    "nan": {},
    # EwmaZ(alpha, warmup, z) plus a relative floor; > max_factor x the max seen after
    # max_after steps is catastrophic whatever the variance (Megatron's rule). A healthy
    # small-batch run's loss noise reaches z 3.6 at 1.4x its running mean every few hundred
    # steps (nano, 8 x 64 tokens a step): a spike is at least twice the mean and z 4
    "loss_spike": {"alpha": 0.02, "warmup": 5, "z": 4.0, "min_rise": 1.0,
                   "max_factor": 10.0, "max_after": 100, "wide": 3},
    # the gradient norm swings widely early in training (a clean tiny run reaches 8x its
    # running mean near step 30), so it is judged only after 100 steps and more strictly;
    # an early injected spike is caught by the loss detector in the same step. Later, a
    # healthy nano run's pre-clip norm reaches 3.8x its running mean (z 27: its variance is
    # small), so only the rise tells: 6x the mean
    "grad_spike": {"alpha": 0.02, "warmup": 100, "z": 4.0, "min_rise": 5.0,
                   "max_factor": 10.0, "max_after": 100, "wide": 3},
    # windowed median throughput against the best windowed median (NVRx: best/current < 0.7)
    "throughput_drop": {"ratio": 0.7, "window": 10, "warmup": 5},
    # per-rank compute time over a window: median of the other ranks / rank < score, for
    # `patience` steps in a row. Against the median, not the fastest (one lucky rank must not
    # make all others slow), and 2x (DLRover's rule) rather than NVRx's 0.7: ranks sharing
    # oversubscribed cores drift 1.5x apart for several steps without being stragglers, and
    # one of them starved for two or three steps is not one either: the median over 5 steps
    # must stay 2x off for 3 steps (a real one is named about 6 steps after it slows down)
    # (the first `warmup` steps, with their allocations and first-call costs, are skipped).
    # A rank still named `persist` steps later (rebalancing did not bring it back: a
    # persistent straggler) is named again, which takes the ladder's next rung. The
    # rebalancer follows the ranks' speeds, median over `rebalance_window` steps, while their
    # times differ by more than `rebalance_tolerance`, and shares that close to even become
    # even (ranks on shared cores drift 10-15% apart: that is noise, not a straggler)
    "straggler": {"score": 0.5, "window": 5, "patience": 3, "warmup": 10, "persist": 30,
                  "rebalance_window": 10, "rebalance_tolerance": 0.15},
    "hang": {},
    # per layer over a window: mean normalised load entropy below `entropy`, or at least
    # `dead_share` of the experts without a token for the whole window
    # (the first `warmup` steps are the router's own balancing: a fresh ling2 router starts
    # collapsed and the bias update evens it out over ~150 steps at the tiny preset's rate)
    "expert_collapse": {"entropy": 0.6, "dead_share": 0.5, "window": 50, "warmup": 150},
    # window means of memory rising by more than `min_growth` for `windows` windows in a row
    "memory_growth": {"window": 20, "windows": 5, "min_growth": 0.01},
    "crash": {},
    # a rank whose loss differed when the `rerun` rung trained its step again on the same data
    # from the same state (silent data corruption, Megatron's rerun machine); no threshold
    "sdc_suspect": {},
}

# weakest to strongest (ActionName's order): when several decisions share a step, the loop
# carries out the last; set, decide and refused answer commands only
ACTIONS = tuple(a for a in ActionName
                if a not in (ActionName.SET, ActionName.DECIDE, ActionName.REFUSED))
LADDER_ACTIONS = tuple(a for a in ACTIONS if a != ActionName.RESUME)

DEFAULT_LADDERS: dict[str, list[str]] = {
    "nan": ["skip_update", "rollback", "pause"],  # two in a row -> roll back (spec §6 A1)
    "loss_spike": ["skip_update", "retry_step", "lr_cut", "rollback", "pause"],  # Ling §8
    "grad_spike": ["skip_update", "lr_cut", "rollback", "pause"],
    "throughput_drop": ["observe"],
    # AntDT: less data; a persistent straggler's host is drained and the job goes on without it
    # (on one host there is no other: it stays rebalanced and a person is asked, ladder.py)
    "straggler": ["rebalance", "exclude", "pause"],
    "hang": ["restart", "pause"],
    "expert_collapse": ["observe", "lr_cut", "rollback", "pause"],
    "memory_growth": ["observe", "checkpoint", "pause"],
    "crash": ["restart", "pause"],
    # reported for a person to look at; a job on several hosts may `exclude` the suspect's
    "sdc_suspect": ["observe"],
}
# `rerun` trains the step again before its update is applied: it can tell only the anomalies
# found in the step's own forward-backward (the gradient norm is known once the update is)
RERUN_KINDS = (AnomalyKind.LOSS_SPIKE, AnomalyKind.NAN)

_PATH = "faults.policy"

# Upper bounds (README's spec table): a day's hang timeout, a hundred restarts, and for every
# threshold (counts of steps, factors, z-scores) a million, which no detector needs.
BOUNDS: dict[str, int] = {"hang_timeout_s": 86400, "max_restarts": 100, "policy_restarts": 100,
                          "policy_restart_window_s": 7 * 86400, "approve_timeout_s": 86400,
                          "thresholds.*.*": 1_000_000}
PROPOSED = "proposed"  # `approve_default`: on timeout, take the action that was proposed
APPROVE_WHILE = ("hold", "observe")  # what the run does while a proposal waits


@dataclass
class FaultPolicy:
    thresholds: dict[str, dict[str, float]] = field(default_factory=dict)
    actions: dict[str, list[str]] = field(default_factory=dict)
    hang_timeout_s: float = 300.0
    max_restarts: int = 3  # crash restarts (a rank died), the launcher's
    # restarts the policy asks for, per anomaly kind within the window; then the next rung
    policy_restarts: int = 2
    policy_restart_window_s: float = 3600.0
    approve: list[str] = field(default_factory=list)
    approve_timeout_s: float = 300.0
    approve_default: str = PROPOSED
    approve_while: str = "hold"


def policy_errors(policy: FaultPolicy) -> dict[str, str]:
    """Every problem in `policy` as {dotted spec field: message}; empty when it is valid."""
    errors = {**_threshold_errors(policy.thresholds), **_action_errors(policy.actions),
              **_approval_errors(policy)}
    if policy.hang_timeout_s <= 0:
        errors[f"{_PATH}.hang_timeout_s"] = "must be positive"
    for name in ("max_restarts", "policy_restarts"):
        if getattr(policy, name) < 0:
            errors[f"{_PATH}.{name}"] = "must be at least 0"
    if policy.policy_restart_window_s <= 0:
        errors[f"{_PATH}.policy_restart_window_s"] = "must be positive"
    for name in ("hang_timeout_s", "max_restarts", "policy_restarts", "policy_restart_window_s",
                 "approve_timeout_s"):
        if getattr(policy, name) > BOUNDS[name]:
            errors[f"{_PATH}.{name}"] = f"must be at most {BOUNDS[name]}"
    return errors


def policy_thresholds(policy: FaultPolicy) -> dict[str, dict[str, float]]:
    """DEFAULTS overlaid with the policy's thresholds; SpecError naming every bad field."""
    _check(policy)
    return {kind: {**params, **policy.thresholds.get(kind, {})}
            for kind, params in DEFAULTS.items()}


def policy_ladders(policy: FaultPolicy) -> dict[str, list[str]]:
    """DEFAULT_LADDERS with the policy's ladders in place; SpecError naming every bad field."""
    _check(policy)
    return {kind: list(policy.actions.get(kind, ladder))
            for kind, ladder in DEFAULT_LADDERS.items()}


def _check(policy: FaultPolicy) -> None:
    errors = policy_errors(policy)
    if errors:
        raise SpecError(errors)


def _threshold_errors(thresholds: dict[str, dict[str, float]]) -> dict[str, str]:
    errors: dict[str, str] = {}
    for kind, params in thresholds.items():
        path = f"{_PATH}.thresholds.{kind}"
        if kind not in DEFAULTS:
            errors[path] = f"unknown anomaly kind; valid: {', '.join(KINDS)}"
            continue
        for param, value in params.items():
            if param not in DEFAULTS[kind]:
                valid = ", ".join(DEFAULTS[kind]) or "none"
                errors[f"{path}.{param}"] = f"unknown threshold; valid: {valid}"
            elif not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                errors[f"{path}.{param}"] = "must be a finite number >= 0"
            elif value > BOUNDS["thresholds.*.*"]:
                errors[f"{path}.{param}"] = f"must be at most {BOUNDS['thresholds.*.*']}"
            elif param == "alpha" and not 0 < value < 1:
                errors[f"{path}.{param}"] = "must be between 0 and 1"
    return errors


def _action_errors(actions: dict[str, list[str]]) -> dict[str, str]:
    errors: dict[str, str] = {}
    for kind, ladder in actions.items():
        path = f"{_PATH}.actions.{kind}"
        if kind not in KINDS:
            errors[path] = f"unknown anomaly kind; valid: {', '.join(KINDS)}"
        elif not ladder:
            errors[path] = "must list at least one action"
        else:
            for i, action in enumerate(ladder):
                if action not in LADDER_ACTIONS:
                    errors[f"{path}.{i}"] = (f"unknown action {action!r}; valid: "
                                             f"{', '.join(LADDER_ACTIONS)}")
                elif action == ActionName.RERUN and kind not in RERUN_KINDS:
                    errors[f"{path}.{i}"] = ("rerun answers only the anomalies found before "
                                             f"the update: {', '.join(RERUN_KINDS)}")
    return errors


def _approval_errors(policy: FaultPolicy) -> dict[str, str]:
    errors: dict[str, str] = {}
    for i, action in enumerate(policy.approve):
        if action not in LADDER_ACTIONS:
            errors[f"{_PATH}.approve.{i}"] = (f"unknown action {action!r}; valid: "
                                              f"{', '.join(LADDER_ACTIONS)}")
    if not policy.approve_timeout_s > 0:
        errors[f"{_PATH}.approve_timeout_s"] = "must be a positive number of seconds"
    if policy.approve_default not in (PROPOSED, *LADDER_ACTIONS):
        errors[f"{_PATH}.approve_default"] = (f"must be {PROPOSED!r} or an action: "
                                              f"{', '.join(LADDER_ACTIONS)}")
    if policy.approve_while not in APPROVE_WHILE:
        errors[f"{_PATH}.approve_while"] = f"must be one of {', '.join(APPROVE_WHILE)}"
    return errors
