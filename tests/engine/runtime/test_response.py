"""The fault response: every ladder action becomes exactly one verdict, and the response
publishes what the detectors found and what the policy did."""

import dataclasses

import pytest

from engine.anomaly import ACTIONS, Anomaly, Decision, FaultManager
from engine.contract import ActionEvent, AnomalyEvent, BadBatchEvent
from engine.runtime.rerun import attribute
from engine.runtime.response import (
    Apply,
    Discard,
    FaultResponse,
    Rerun,
    Rollback,
    Stop,
    verdict_for,
)


def decision(action: str, **params) -> Decision:
    return Decision(action, "loss_spike", step=7, rung=1, rank=2, reason="repeat", params=params)


EXPECTED = {
    "observe": Apply(),
    "rerun": Rerun(),  # FaultResponse.settle_rerun says what follows it
    "skip_update": Discard(step_back=1, rewind_data=False),
    "retry_step": Discard(step_back=1, rewind_data=True),
    "lr_cut": Apply(lr_factor=0.25),
    "checkpoint": Apply(checkpoint=True),
    "rebalance": Apply(rebalance=True),
    "rollback": Rollback(),
    "pause": Stop(outcome="pause"),
    # the ranks snapshot the step before it and the launcher starts them again from there
    "restart": Stop(outcome="restart"),
    # carried out by a person or the platform, never by the loop: the update stands
    "resume": Apply(),
    "reshard": Apply(),
    "cancel": Apply(),
    # the platform drains the straggler's host and moves the job; the run goes on meanwhile
    "exclude": Apply(),
}


def test_every_ladder_action_has_a_verdict():
    assert set(EXPECTED) == set(ACTIONS)


@pytest.mark.parametrize("action", ACTIONS)
def test_each_action_maps_to_its_one_verdict(action):
    d = decision(action, **({"lr_factor": 0.25} if action == "lr_cut" else {}))
    assert verdict_for(d) == dataclasses.replace(EXPECTED[action], decision=d)


def test_no_decision_applies_the_update_at_the_full_learning_rate():
    assert verdict_for(None) == Apply(decision=None, lr_factor=1.0, checkpoint=False,
                                      rebalance=False)


def test_an_lr_cut_without_a_factor_cuts_to_a_tenth():
    assert verdict_for(decision("lr_cut")).lr_factor == 0.1


class FakeFaults:
    """Answers `step` with a fixed judgement and records the signals it was given."""

    def __init__(self, anomalies, decisions):
        self.anomalies, self.decisions = anomalies, decisions
        self.calls = []

    def step(self, step, **signals):
        self.calls.append((step, signals))
        return self.anomalies, self.decisions


def test_judge_publishes_anomalies_and_the_decisions_not_carried_out():
    spike = Anomaly("loss_spike", "warning", 7, rank=2, evidence={"z": 9.0})
    strong, weak = decision("rollback"), decision("observe")
    events = []
    response = FaultResponse(FakeFaults([spike], [strong, weak]), events.append)

    verdict = response.judge(7, local_loss=3.5)

    assert verdict == Rollback(strong)
    assert response.found
    assert events == [
        AnomalyEvent(step=7, kind="loss_spike", severity="warning", rank=2, evidence={"z": 9.0}),
        ActionEvent(step=7, action="observe", by="policy", anomaly="loss_spike", rung=1, rank=2,
                    reason="repeat"),
    ]


def test_announce_publishes_the_decision_with_what_carrying_it_out_did():
    events = []
    response = FaultResponse(FakeFaults([], []), events.append)
    response.announce(verdict_for(decision("lr_cut", lr_factor=0.1)), checkpoint="/c/step-7")
    response.announce(verdict_for(None))  # nothing was decided: nothing to say
    (event,) = events
    assert (event.action, event.step, event.by) == ("lr_cut", 7, "policy")
    assert event.to_dict()["lr_factor"] == 0.1
    assert event.to_dict()["checkpoint"] == "/c/step-7"


def test_each_completed_steps_signals_are_judged_once():
    faults = FakeFaults([], [])
    response = FaultResponse(faults, lambda event: None)
    response.observe(grad_norm=1.5, tokens_per_s=900.0, rss=10, ops={"step": 3},
                     experts=[{"balance": 1.0}])
    assert response.judge(4, local_loss=2.0) == Apply()
    response.judge(5, local_loss=2.0)  # step 4 was discarded: no signals of its own
    (_, first), (_, second) = faults.calls
    assert first == {"loss": 2.0, "grad_norm": 1.5, "tokens_per_s": 900.0, "memory_bytes": 10,
                     "aggregate": {"step": 3}, "experts": {"0": {"balance": 1.0}}}
    assert second == {"loss": 2.0, "grad_norm": None, "tokens_per_s": None,
                      "memory_bytes": None, "aggregate": None, "experts": None}
    assert not response.found


def test_a_rerun_names_the_ranks_its_anomaly_was_found_on():
    spikes = [Anomaly("loss_spike", "warning", 7, rank=r) for r in (3, 1)]
    rerun = decision("rerun")
    response = FaultResponse(FakeFaults(spikes, [rerun]), lambda event: None)
    assert response.judge(7, local_loss=30.0) == Rerun(rerun, ranks=(1, 3))


def test_a_rerun_that_blames_the_data_records_the_batch_and_skips_it():
    events = []
    faults = FaultManager()
    response = FaultResponse(faults, events.append)
    rerun = Rerun(decision("rerun"), ranks=(1,))
    verdict = response.settle_rerun(rerun, attribute([3.0, 9.0], [3.0, 9.0], [1]),
                                    samples=[6, 7], windows=[40, 12])
    assert isinstance(verdict, Discard) and verdict.step_back == 1 and not verdict.rewind_data
    assert verdict.decision.params["cause"] == "data"
    assert events == [BadBatchEvent(step=7, anomaly="loss_spike", ranks=[1], samples=[6, 7],
                                    windows=[40, 12],
                                    evidence={"loss": [3.0, 9.0], "rerun_loss": [3.0, 9.0]})]
    assert faults.step(8) == ([], [])  # nobody's result differed: no suspect


def test_a_rerun_that_blames_the_step_applies_it_and_reports_the_suspect():
    events = []
    faults = FaultManager()
    response = FaultResponse(faults, events.append)
    verdict = response.settle_rerun(Rerun(decision("rerun"), ranks=(1,)),
                                    attribute([3.0, 90.0], [3.0, 9.0], [1]), [6, 7], [40, 12])
    assert isinstance(verdict, Apply) and verdict.decision.params["differed_ranks"] == [1]
    assert events == []  # no bad batch
    (suspect,), (observed,) = faults.step(8)  # the next step's agreement and ladder
    assert (suspect.kind, suspect.rank, suspect.evidence["rerun_loss"]) == ("sdc_suspect", 1, 9.0)
    assert observed.action == "observe"
