"""The response ladder: first rung, escalation on repeats, reset, caps, policy overrides."""

from __future__ import annotations

import pytest

from engine.anomaly import Anomaly, ResponseLadder
from engine.anomaly.ladder import cannot_help
from engine.anomaly.policy import FaultPolicy
from engine.errors import SpecError

HOUR = 3600.0


def spike(step: int, kind: str = "loss_spike", rank: int | None = 0) -> list[Anomaly]:
    return [Anomaly(kind, "error", step, rank, {"value": 1.0})]


def actions(ladder: ResponseLadder, steps: list[int], kind: str = "loss_spike",
            now: float = 0.0) -> list[str]:
    return [ladder.decide(spike(s, kind), s, now)[0].action for s in steps]


def test_loss_spikes_climb_the_ling_ladder_then_page_a_person():
    ladder = ResponseLadder()
    assert actions(ladder, [10, 11, 12, 13, 14, 15]) == [
        "skip_update", "retry_step", "lr_cut", "rollback", "pause", "pause"]


def test_the_ladder_starts_over_after_quiet_steps():
    ladder = ResponseLadder(reset_after=100)
    assert actions(ladder, [10, 20]) == ["skip_update", "retry_step"]
    assert actions(ladder, [200]) == ["skip_update"]


def test_nan_twice_in_a_row_rolls_back():
    assert actions(ResponseLadder(), [5, 6], kind="nan") == ["skip_update", "rollback"]


def test_one_retry_per_step_then_the_next_rung():
    ladder = ResponseLadder(FaultPolicy(actions={"loss_spike": ["retry_step", "lr_cut"]}))
    first = ladder.decide(spike(40), 40, 0.0)[0]
    again = ladder.decide(spike(40), 40, 0.0)[0]  # the retried step spikes again
    assert (first.action, again.action) == ("retry_step", "lr_cut")
    assert again.params == {"lr_factor": 0.1}


def test_two_rollbacks_per_hour_then_pause():
    ladder = ResponseLadder(FaultPolicy(actions={"nan": ["rollback"]}), reset_after=0)
    decided = [ladder.decide(spike(s, "nan"), s, now)[0] for s, now in
               [(10, 0.0), (500, 60.0), (900, 120.0), (2000, HOUR + 61.0)]]
    assert [d.action for d in decided] == ["rollback", "rollback", "pause", "rollback"]
    assert decided[2].reason == "rollback capped"


def test_policy_restarts_are_capped_per_kind_within_the_window_then_pause():
    policy = FaultPolicy(actions={"hang": ["restart"], "loss_spike": ["restart"]},
                         policy_restarts=2, policy_restart_window_s=HOUR)
    ladder = ResponseLadder(policy, reset_after=0)
    decided = [ladder.decide(spike(s, "hang"), s, now)[0] for s, now in
               [(10, 0.0), (20, 60.0), (30, 120.0)]]
    assert [d.action for d in decided] == ["restart", "restart", "pause"]
    assert decided[2].reason == "restart capped: 2 for hang within 3600 s"
    # another kind has a budget of its own, and an hour later the first kind's is back
    assert actions(ladder, [40], kind="loss_spike", now=130.0) == ["restart"]
    assert actions(ladder, [50], kind="hang", now=HOUR + 61.0) == ["restart"]


def test_the_crash_budget_is_not_the_policys():
    ladder = ResponseLadder(FaultPolicy(max_restarts=0, policy_restarts=1), reset_after=0)
    assert actions(ladder, [10, 20], kind="hang") == ["restart", "pause"]


def test_several_kinds_in_one_step_strongest_first():
    ladder = ResponseLadder()
    found = spike(7, "throughput_drop", None) + spike(7, "nan", 1) + spike(7, "grad_spike", 1)
    decisions = ladder.decide(found, 7, 0.0)
    assert [(d.anomaly, d.action) for d in decisions] == [
        ("nan", "skip_update"), ("grad_spike", "skip_update"), ("throughput_drop", "observe")]
    event = decisions[0].event_fields()
    assert event["action"] == "skip_update" and event["anomaly"] == "nan"
    assert event["rank"] == 1 and event["by"] == "policy"


def test_policy_actions_replace_a_kinds_ladder_and_bad_ones_name_the_field():
    ladder = ResponseLadder(FaultPolicy(actions={"straggler": ["restart"]}))
    assert ladder.ladders["straggler"] == ["restart"]
    with pytest.raises(SpecError) as e:
        ResponseLadder(FaultPolicy(actions={"nan": ["skip", "pause"], "oom": ["pause"],
                                            "hang": []}))
    assert set(e.value.errors) == {"faults.policy.actions.nan.0", "faults.policy.actions.oom",
                                   "faults.policy.actions.hang"}


def test_state_dict_round_trip_keeps_escalation_and_caps():
    a = ResponseLadder()
    actions(a, [10, 11])
    actions(a, [10], kind="hang")
    b = ResponseLadder()
    b.load_state_dict(a.state_dict())
    assert actions(a, [12, 13]) == actions(b, [12, 13]) == ["lr_cut", "rollback"]
    # a restart's snapshot carries the restarts taken, so the restarted ranks keep counting
    assert actions(b, [200, 400], kind="hang") == ["restart", "pause"]


def test_a_persistent_straggler_is_excluded_on_several_hosts():
    straggler = [Anomaly("straggler", "error", 20, rank=3)]
    ladder = ResponseLadder(hosts=2)
    assert [d.action for d in ladder.decide(straggler, 20, now=0.0)] == ["rebalance"]
    assert [d.action for d in ladder.decide(straggler, 50, now=1.0)] == ["exclude"]


def test_on_one_host_a_persistent_straggler_stays_rebalanced_and_a_person_is_asked():
    straggler = [Anomaly("straggler", "error", 20, rank=1)]
    ladder = ResponseLadder(hosts=1)
    assert ladder.decide(straggler, 20, now=0.0)[0].action == "rebalance"
    (asked,) = ladder.decide(straggler, 50, now=1.0)
    assert asked.action == "observe"  # neither an exclude, nor a pause
    assert asked.params == {"skipped": ["exclude"], "needs_attention": "pause"}
    assert asked.reason == ("repeat within the window; exclude skipped: the job runs on one "
                            "host, with no other to move to; needs attention")
    # named again while the person has not answered: the run goes on as it is, asked once
    (again,) = ladder.decide(straggler, 80, now=2.0)
    assert (again.action, again.params) == ("observe", {})
    assert again.reason == "needs attention (asked at step 50)"


def test_a_straggler_named_anew_is_rebalanced_again_and_only_a_persisting_one_climbs():
    ladder = ResponseLadder(hosts=2)
    named = [Anomaly("straggler", "error", s, rank=1, evidence={"persisting": p})
             for s, p in ((20, False), (40, False), (70, True))]
    assert [ladder.decide([a], a.step, 0.0)[0].action for a in named] == [
        "rebalance", "rebalance", "exclude"]


def test_a_restart_never_answers_a_straggler_it_cannot_cure():
    ladder = ResponseLadder(FaultPolicy(actions={"straggler": ["restart", "exclude", "pause"]}),
                            hosts=2)
    (decided,) = ladder.decide([Anomaly("straggler", "error", 20, rank=3)], 20, now=0.0)
    assert (decided.action, decided.params) == ("exclude", {"skipped": ["restart"]})
    assert "restart skipped: the ranks restart on the same hosts" in decided.reason


def test_rungs_that_cannot_help_say_why_and_others_may():
    assert cannot_help("exclude", "straggler", hosts=1) is not None
    assert cannot_help("exclude", "straggler", hosts=2) is None
    assert cannot_help("restart", "straggler", hosts=4) is not None
    assert cannot_help("restart", "hang", hosts=1) is None
