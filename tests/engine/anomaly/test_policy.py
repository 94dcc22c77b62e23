"""The fault policy's one validator names every bad field with its spec path, and the
thresholds and ladders in force are the defaults with the policy's overrides."""

from __future__ import annotations

import math

import pytest

from engine.anomaly.policy import (
    DEFAULT_LADDERS,
    DEFAULTS,
    LADDER_ACTIONS,
    FaultPolicy,
    policy_errors,
    policy_ladders,
    policy_thresholds,
)
from engine.errors import SpecError

KINDS_LIST = ("nan, loss_spike, grad_spike, throughput_drop, straggler, hang, expert_collapse, "
              "memory_growth, crash, sdc_suspect")


def test_the_default_policy_is_valid_and_in_force_as_the_defaults():
    assert policy_errors(FaultPolicy()) == {}
    assert policy_thresholds(FaultPolicy()) == DEFAULTS
    assert policy_ladders(FaultPolicy()) == DEFAULT_LADDERS


def test_every_bad_threshold_is_named_with_why():
    policy = FaultPolicy(thresholds={
        "weather": {},
        "nan": {"z": 1},
        "loss_spike": {"zz": 3, "z": -1, "min_rise": math.inf, "max_factor": "10"},
        "grad_spike": {"alpha": 1.0},
    })
    assert policy_errors(policy) == {
        "faults.policy.thresholds.weather": f"unknown anomaly kind; valid: {KINDS_LIST}",
        "faults.policy.thresholds.nan.z": "unknown threshold; valid: none",
        "faults.policy.thresholds.loss_spike.zz": (
            "unknown threshold; valid: alpha, warmup, z, min_rise, max_factor, max_after, wide"),
        "faults.policy.thresholds.loss_spike.z": "must be a finite number >= 0",
        "faults.policy.thresholds.loss_spike.min_rise": "must be a finite number >= 0",
        "faults.policy.thresholds.loss_spike.max_factor": "must be a finite number >= 0",
        "faults.policy.thresholds.grad_spike.alpha": "must be between 0 and 1",
    }


def test_every_bad_ladder_is_named_with_why():
    policy = FaultPolicy(actions={"oom": ["pause"], "hang": [],
                                  "nan": ["skip_update", "reboot", "resume"]})
    valid = ", ".join(LADDER_ACTIONS)
    assert policy_errors(policy) == {
        "faults.policy.actions.oom": f"unknown anomaly kind; valid: {KINDS_LIST}",
        "faults.policy.actions.hang": "must list at least one action",
        "faults.policy.actions.nan.1": f"unknown action 'reboot'; valid: {valid}",
        "faults.policy.actions.nan.2": f"unknown action 'resume'; valid: {valid}",
    }


def test_rerun_answers_only_what_is_found_before_the_update():
    assert policy_errors(FaultPolicy(actions={"loss_spike": ["rerun"], "nan": ["rerun"]})) == {}
    assert policy_errors(FaultPolicy(actions={"grad_spike": ["rerun", "skip_update"]})) == {
        "faults.policy.actions.grad_spike.0": ("rerun answers only the anomalies found before "
                                               "the update: loss_spike, nan")}


def test_the_hang_timeout_must_be_positive_and_restarts_not_negative():
    assert policy_errors(FaultPolicy(hang_timeout_s=0, max_restarts=-1, policy_restarts=-1,
                                     policy_restart_window_s=0)) == {
        "faults.policy.hang_timeout_s": "must be positive",
        "faults.policy.max_restarts": "must be at least 0",
        "faults.policy.policy_restarts": "must be at least 0",
        "faults.policy.policy_restart_window_s": "must be positive",
    }
    assert policy_errors(FaultPolicy(hang_timeout_s=0.5, max_restarts=0, policy_restarts=0)) == {}


def test_overrides_replace_only_what_they_name():
    policy = FaultPolicy(thresholds={"loss_spike": {"z": 6.0}},
                         actions={"straggler": ["restart"]})
    thresholds = policy_thresholds(policy)
    assert thresholds["loss_spike"] == {**DEFAULTS["loss_spike"], "z": 6.0}
    assert thresholds["grad_spike"] == DEFAULTS["grad_spike"]
    ladders = policy_ladders(policy)
    assert ladders["straggler"] == ["restart"]
    assert ladders["nan"] == DEFAULT_LADDERS["nan"]


def test_values_in_force_are_refused_for_an_invalid_policy_with_every_error():
    policy = FaultPolicy(thresholds={"nan": {"z": 1}}, actions={"hang": []})
    for values_in_force in (policy_thresholds, policy_ladders):
        with pytest.raises(SpecError) as e:
            values_in_force(policy)
        assert e.value.errors == policy_errors(policy)


def test_bad_approval_fields_are_named_with_why():
    errors = policy_errors(FaultPolicy(approve=["rollback", "reboot"], approve_timeout_s=-1,
                                       approve_default="later", approve_while="wait"))
    assert errors == {
        "faults.policy.approve.1": f"unknown action 'reboot'; valid: {', '.join(LADDER_ACTIONS)}",
        "faults.policy.approve_timeout_s": "must be a positive number of seconds",
        "faults.policy.approve_default": (f"must be 'proposed' or an action: "
                                          f"{', '.join(LADDER_ACTIONS)}"),
        "faults.policy.approve_while": "must be one of hold, observe",
    }
    assert policy_errors(FaultPolicy(approve_timeout_s=86401)) == {
        "faults.policy.approve_timeout_s": "must be at most 86400"}
    assert policy_errors(FaultPolicy(approve=["restart", "rollback"], approve_timeout_s=30,
                                     approve_default="pause", approve_while="observe")) == {}
