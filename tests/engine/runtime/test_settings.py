"""Live settings: a `set` is validated key by key as the spec is, applied whole or not at all,
reaches the parts that copied a value at construction, and survives a state round trip."""

import pytest

from engine.anomaly import FaultManager
from engine.errors import SpecError
from engine.runtime.schedule import lr_at
from engine.runtime.settings import SETTINGS_LOG, LiveSettings, carry_over
from engine.runtime.spec import parse_spec, validate_settings


class Optimizer:
    weight_decay = 0.1

    def set_weight_decay(self, weight_decay: float) -> None:
        self.weight_decay = weight_decay


class Schedule:
    def __init__(self):
        self.calls = []

    def set_schedule(self, every: int, keep: int, memory_every: int) -> None:
        self.calls.append((every, keep, memory_every))


def live(**train) -> LiveSettings:
    spec = parse_spec({"name": "t", "train": {"steps": 100, "warmup": 10, **train},
                       "checkpoint": {"every": 50, "keep": 3}})
    settings = LiveSettings(spec, Optimizer(), FaultManager(spec.faults.policy))
    settings.checkpointer = Schedule()
    return settings


def test_values_are_checked_by_the_spec_rules_and_converted():
    assert validate_settings({"train.lr": 1, "checkpoint.every": 20}) == {
        "train.lr": 1.0, "checkpoint.every": 20}
    with pytest.raises(SpecError) as bad:
        validate_settings({"train.lr": -1, "train.lr_factor": 0, "train.steps": 5,
                           "checkpoint.keep": "3",
                           "faults.policy.actions": {"nan": ["reboot"]}})
    assert bad.value.errors == {
        "checkpoint.keep": "must be an integer",
        "faults.policy.actions.nan.0": bad.value.errors["faults.policy.actions.nan.0"],
        "train.lr": "must be a positive number",
        "train.lr_factor": "must be a positive number",
        "train.steps": bad.value.errors["train.steps"],
    }
    assert "unknown action 'reboot'" in bad.value.errors["faults.policy.actions.nan.0"]
    assert bad.value.errors["train.steps"].startswith("not a live setting; valid: train.lr, ")
    with pytest.raises(SpecError, match="at least one setting"):
        validate_settings({})


def test_a_change_reports_old_and_new_and_the_loop_reads_it_from_the_spec():
    s = live(lr=1e-3)
    changes = s.change({"train.lr": 5e-4, "train.grad_clip": 0.5, "train.eval_every": 7})
    assert changes == {"train.lr": {"old": 1e-3, "new": 5e-4},
                       "train.grad_clip": {"old": 1.0, "new": 0.5},
                       "train.eval_every": {"old": 50, "new": 7}}
    t = s.spec.train
    assert (t.lr, t.grad_clip, t.eval_every) == (5e-4, 0.5, 7)


def test_a_refused_change_changes_nothing():
    s = live(lr=1e-3)
    with pytest.raises(SpecError, match="train.warmup: must be at least 0"):
        s.change({"train.lr": 5e-4, "train.warmup": -1})
    assert s.spec.train.lr == 1e-3 and s.overrides == {}


def test_the_lr_factor_and_decay_end_reshape_the_schedule_from_now_on():
    s = live(lr=1e-3, min_lr_ratio=0.1)
    s.change({"train.lr_factor": 0.5, "train.decay_end": 40})
    assert s.lr_factor == 0.5
    assert lr_at(40, s.spec.train) == pytest.approx(1e-4)  # decayed at 40, not at 100
    assert lr_at(70, s.spec.train) == pytest.approx(1e-4)


def test_weight_decay_schedule_and_fault_policy_reach_their_owners():
    s = live()
    s.change({"train.weight_decay": 0.0, "checkpoint.every": 20, "checkpoint.keep": 5})
    assert s.optimizer.weight_decay == 0.0
    assert s.checkpointer.calls == [(20, 5, 0)]
    s.change({"faults.policy.thresholds": {"loss_spike": {"z": 6.0}},
              "faults.policy.actions": {"loss_spike": ["observe"]}})
    assert s.faults.detectors.thresholds["loss_spike"]["z"] == 6.0
    assert s.faults.detectors.loss.z == 6.0  # the running detector, its statistics kept
    assert s.faults.ladder.ladders["loss_spike"] == ["observe"]


def test_the_state_carries_the_changes_over_the_spec_as_launched():
    s = live(lr=1e-3)
    s.change({"train.lr": 5e-4, "checkpoint.every": 20})
    saved = s.state_dict()

    fresh = live(lr=1e-3)
    fresh.load_state_dict(saved)
    assert fresh.spec.train.lr == 5e-4 and fresh.checkpointer.calls == [(20, 3, 0)]
    assert fresh.values()["train.lr"] == 5e-4

    # a state from before the change (or from before `set` existed) brings the spec's back
    s.load_state_dict({})
    assert s.spec.train.lr == 1e-3 and s.spec.checkpoint.every == 50 and s.overrides == {}


def test_the_log_carries_the_changes_in_force_over_an_older_checkpoint_after_a_restart(tmp_path):
    log = tmp_path / SETTINGS_LOG
    before = live()
    before.log = log
    older_checkpoint = before.state_dict()  # saved before the set
    before.change({"train.lr": 0.0042, "checkpoint.every": 7})

    restarted = live()  # a rank of the next incarnation, loaded from that checkpoint
    restarted.load_state_dict(older_checkpoint)
    restarted.log = log
    assert carry_over(restarted, resumed=True, broadcast=lambda box: None) == {
        "train.lr": 0.0042, "checkpoint.every": 7}
    assert restarted.spec.train.lr == 0.0042 and restarted.checkpointer.calls == [(7, 3, 0)]

    # another rank takes rank 0's log from the broadcast
    other = live()
    assert carry_over(other, resumed=True,
                      broadcast=lambda box: box.__setitem__(0, {"train.lr": 0.0042})) == {
        "train.lr": 0.0042}

    # a fresh start keeps nothing of a log an earlier run left
    fresh = live()
    fresh.log = log
    assert carry_over(fresh, resumed=False, broadcast=lambda box: None) == {}
    assert not log.exists() and fresh.spec.train.lr == live().spec.train.lr


class Weights:
    names = ["web", "code"]

    def __init__(self):
        self.calls = []

    def set_weights(self, weights: list[float]) -> None:
        self.calls.append(weights)


def test_the_mixture_weights_are_live_checked_against_the_sources_and_reach_the_loader():
    spec = parse_spec({"name": "t", "train": {"data": {"mix": [
        {"path": "/d/web", "weight": 3}, {"path": "/d/code", "weight": 1}]}}})
    loader = Weights()
    settings = LiveSettings(spec, Optimizer(), FaultManager(spec.faults.policy), loader)
    assert settings.values()["train.data.mix_weights"] == [3.0, 1.0]
    with pytest.raises(SpecError, match="list of positive numbers"):
        validate_settings({"train.data.mix_weights": [1, -1]})
    with pytest.raises(SpecError, match="2 sources, got 3"):
        settings.change({"train.data.mix_weights": [1, 1, 1]})
    assert loader.calls == []
    assert settings.change({"train.data.mix_weights": [1, 4]}) == {
        "train.data.mix_weights": {"old": [3.0, 1.0], "new": [1.0, 4.0]}}
    assert loader.calls == [[1.0, 4.0]]
    again = LiveSettings(spec, Optimizer(), FaultManager(spec.faults.policy), Weights())
    again.load_state_dict(settings.state_dict())
    assert again.loader.calls == [[1.0, 4.0]]
