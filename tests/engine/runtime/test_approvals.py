"""Approved actions: a ladder decision in `faults.policy.approve` becomes a proposal; the ranks
hold at the step boundary (or train on, observing) until a person decides or the deadline takes
the policy's default; a decision on a proposal that moved on is refused with the reason.

One rank with its collectives faked (tests/engine/runtime/test_commands.py's fakes), then the
real CLI on two gloo ranks steered through its control file."""

import time

from engine.anomaly import Anomaly, Decision, FaultPolicy
from engine.contract import ActionEvent, Command, CommandKind, ProposalEvent
from engine.runtime.approvals import Approvals
from engine.runtime.commands import CommandInbox, PauseWait
from engine.runtime.response import FaultResponse, Rollback
from tests.engine.runtime.test_commands import Agreement, Clock, PollByPoll, Watchdog, handler
from tests.engine.runtime.test_control import Run, nano
from tests.engine.runtime.test_response import FakeFaults

SPIKE = Anomaly("loss_spike", "warning", 7, evidence={"z": 9.0})
ROLLBACK = Decision("rollback", "loss_spike", 7, rung=0, reason="first occurrence")
NOW = 1000.0  # the agreed wall clock of step 7


def approvals(*arrivals: list[Command], **policy) -> tuple[Approvals, list, Watchdog]:
    """Rank 0's approvals; `arrivals`: what its channel reads at each poll of a hold (each poll
    takes a second of the fake clock)."""
    events, watchdog = [], Watchdog()
    inbox = CommandInbox(PollByPoll(arrivals), events.append, broadcast=lambda box: None)
    wait = PauseWait(inbox, watchdog, poll_s=0, agree=Agreement(), clock=Clock())
    policy = FaultPolicy(**{"approve": ["rollback"], "approve_timeout_s": 5.0, **policy})
    return Approvals(policy, wait, events.append), events, watchdog


def decide(choice: str, proposal: str = "p-7-1", **args) -> Command:
    return Command(CommandKind.DECIDE, {"proposal": proposal, "choice": choice, **args},
                   id=f"c-{choice}")


def proposals(events: list) -> list[tuple]:
    return [(e.status, e.take, e.by) for e in events if isinstance(e, ProposalEvent)]


def test_an_action_outside_approve_is_carried_out_as_the_ladder_decided():
    a, events, _ = approvals()
    skip = Decision("skip_update", "loss_spike", 7, rung=0)
    assert a.review(skip, [SPIKE], 7, NOW) is skip
    assert a.review(None, [], 8, NOW) is None
    assert events == []


def test_a_proposal_holds_the_ranks_until_a_person_approves_it():
    a, events, watchdog = approvals([], [decide("approve")])
    decision = a.review(ROLLBACK, [SPIKE], 7, NOW)
    assert (decision.action, decision.step) == ("rollback", 7)
    assert "p-7-1 approved by command c-approve" in decision.reason
    proposed = events[0]
    assert (proposed.id, proposed.status, proposed.action, proposed.anomaly) == (
        "p-7-1", "pending", "rollback", "loss_spike")
    assert (proposed.evidence, proposed.deadline, proposed.default, proposed.hold) == (
        {"z": 9.0}, NOW + 5.0, "rollback", True)
    assert proposals(events)[1:] == [("approved", "rollback", "command c-approve")]
    assert events[-1] == ActionEvent(step=7, action="decide", command="c-approve", by="command",
                                     details={"proposal": "p-7-1", "choice": "approved",
                                              "take": "rollback"})
    assert watchdog.calls == ["pause", "resume"]  # holding on purpose is no hang


def test_a_person_may_choose_another_action_or_dismiss_the_proposal():
    a, events, _ = approvals([decide("choose", action="lr_cut")])
    assert a.review(ROLLBACK, [SPIKE], 7, NOW).action == "lr_cut"
    b, _, _ = approvals([decide("dismiss")])
    assert b.review(ROLLBACK, [SPIKE], 7, NOW).action == "observe"
    assert proposals(events)[1:] == [("chosen", "lr_cut", "command c-choose")]


def test_without_an_answer_the_deadline_takes_the_policys_default():
    a, events, watchdog = approvals(approve_timeout_s=3.0, approve_default="pause")
    decision = a.review(ROLLBACK, [SPIKE], 7, NOW)
    assert decision.action == "pause" and "timed_out by timeout" in decision.reason
    assert events[0].default == "pause"
    assert proposals(events) == [("pending", None, None), ("timed_out", "pause", "timeout")]
    assert watchdog.calls == ["pause", "resume"]


def test_a_decision_after_the_run_moved_on_is_refused_with_the_reason():
    a, events, _ = approvals(approve_timeout_s=2.0)
    a.review(ROLLBACK, [SPIKE], 7, NOW)
    a.answer(decide("approve"), 9)
    assert events[-1] == ActionEvent(
        step=9, action="refused", command="c-approve", kind=CommandKind.DECIDE,
        error="decide: proposal p-7-1 is no longer pending: timed_out by timeout at step 7")
    a.answer(decide("approve", proposal="p-99"), 9)
    assert "no pending proposal 'p-99'" in events[-1].error


def test_other_commands_that_arrive_while_holding_are_carried_out_after_the_step():
    checkpoint = Command(CommandKind.CHECKPOINT, id="c-checkpoint")
    a, _, _ = approvals([checkpoint, decide("approve")])
    a.review(ROLLBACK, [SPIKE], 7, NOW)
    assert a.wait.inbox.take() == [checkpoint]


def test_with_approve_while_observe_the_run_trains_on_until_the_answer_arrives():
    a, events, watchdog = approvals(approve_while="observe")
    waiting = a.review(ROLLBACK, [SPIKE], 7, NOW)
    assert waiting.action == "observe" and "p-7-1" in waiting.reason
    assert events[0].hold is False and watchdog.calls == []
    # a second proposal waits for the first: only observed
    assert a.review(ROLLBACK, [SPIKE], 8, NOW + 1).action == "observe"
    h, _, handled = handler()
    h.approvals = a
    h.handle([decide("approve")])  # the answer arrives at a step boundary
    assert a.review(None, [], 9, NOW + 2).action == "rollback"  # carried out on the next update
    assert a.review(None, [], 10, NOW + 3) is None
    assert proposals(events)[1:] == [("approved", "rollback", "command c-approve")]


def test_while_training_on_the_agreed_clock_times_the_proposal_out():
    a, events, _ = approvals(approve_while="observe", approve_default="skip_update")
    a.review(ROLLBACK, [SPIKE], 7, NOW)
    assert a.review(None, [], 8, NOW + 4.9) is None
    timed_out = a.review(None, [], 9, NOW + 5.0)
    assert (timed_out.action, timed_out.step) == ("skip_update", 9)
    assert proposals(events)[1:] == [("timed_out", "skip_update", "timeout")]


STRAGGLER = Anomaly("straggler", "error", 50, rank=1, evidence={"score": 0.3})
ATTENTION = Decision("observe", "straggler", 50, rung=2, rank=1,
                     reason="exclude skipped: the job runs on one host; needs attention",
                     params={"skipped": ["exclude"], "needs_attention": "pause"})


def test_a_decision_that_needs_attention_asks_a_person_and_trains_on_meanwhile():
    a, events, watchdog = approvals()  # `approve` holds for a rollback, never for this
    assert a.review(ATTENTION, [STRAGGLER], 50, NOW) is ATTENTION
    (asked,) = events
    assert (asked.status, asked.action, asked.anomaly, asked.rank, asked.reason) == (
        "pending", "pause", "straggler", 1, ATTENTION.reason)
    assert (asked.default, asked.hold, asked.evidence) == ("observe", False, {"score": 0.3})
    assert watchdog.calls == []
    # nobody answers: at the deadline the run stays as it is
    assert a.review(None, [], 60, NOW + 5.0).action == "observe"
    assert proposals(events)[1:] == [("timed_out", "observe", "timeout")]


def test_a_decision_that_needs_attention_asks_a_person_beside_the_one_carried_out():
    """A straggler's exclude skipped on one host, decided in the step where a spike's rollback
    is the strongest decision: the rollback is carried out and the person is still asked."""
    a, events, _ = approvals(approve=[])
    faults = FakeFaults([SPIKE, STRAGGLER], [ROLLBACK, ATTENTION])
    faults.now = NOW
    verdict = FaultResponse(faults, events.append, a).judge(7, local_loss=3.5)
    assert verdict == Rollback(ROLLBACK)
    (asked,) = [e for e in events if isinstance(e, ProposalEvent)]
    assert (asked.status, asked.action, asked.anomaly, asked.rank) == (
        "pending", "pause", "straggler", 1)


def test_approving_a_needs_attention_proposal_pauses_the_run():
    a, events, _ = approvals()
    a.review(ATTENTION, [STRAGGLER], 50, NOW)
    h, _, _ = handler()
    h.approvals = a
    h.handle([decide("approve", proposal="p-50-1")])
    assert a.review(None, [], 51, NOW + 1).action == "pause"


def test_two_ranks_hold_at_a_spike_until_the_rollback_is_approved(tmp_path):
    spec = nano("approve", steps=16, every=5)
    spec["faults"] = {"policy": {"actions": {"loss_spike": ["rollback"], "straggler": ["observe"]},
                                 "approve": ["rollback"]},
                      "inject": [{"kind": "loss_spike", "step": 12, "factor": 20}]}
    run = Run(tmp_path, spec)
    proposed = run.wait_for(lambda e: e["type"] == "proposal")
    assert (proposed["status"], proposed["action"], proposed["step"]) == ("pending", "rollback", 12)
    time.sleep(1)  # the ranks hold: no step past the spike
    assert max(e["step"] for e in run.events() if e["type"] == "step") == 11
    run.command("decide", proposal=proposed["id"], choice="approve")
    assert run.finish() == 0

    events = run.events()
    decided = [e for e in events if e["type"] == "proposal"][-1]
    assert (decided["status"], decided["take"], decided["by"]) == (
        "approved", "rollback", "command test-decide")
    rollback = next(e for e in events if e["type"] == "action" and e["action"] == "rollback")
    assert (rollback["by"], rollback["from_step"], rollback["to_step"]) == ("policy", 12, 10)
    assert [e["step"] for e in events if e["type"] == "step"][-1] == 16
