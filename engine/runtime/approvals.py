"""Approved actions: the ladder's decisions that wait for a person (`faults.policy.approve`).

`Approvals.review` sees the ladder's strongest decision of every step (on every rank, with the
agreed clock). An action in `approve` becomes a `proposal` event with the anomaly's evidence,
its deadline and the default taken then. With `approve_while: "hold"` the ranks wait at the
step boundary, this step's gradients kept, as a warm pause does, until a `decide` command
answers it (approve, choose another action, dismiss) or the deadline passes; the decision is
carried out on this step's update. With "observe" the run trains on, observing, and the
decision is carried out on the update of the step where it arrives. The deadline is checked
here, so the timeout rule holds without the platform too. A `decide` for a proposal that is
no longer pending is refused with the reason. A decision that `needs_attention` (the ladder
skipped the rungs that could not help, engine.anomaly.ladder) raises a proposal of the action
named there, which never holds and by default leaves the run as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from engine.anomaly import Anomaly, Decision, FaultPolicy
from engine.anomaly.policy import LADDER_ACTIONS, PROPOSED
from engine.contract import (
    ActionBy,
    ActionEvent,
    ActionName,
    Choice,
    Command,
    CommandKind,
    Event,
    ProposalEvent,
    ProposalStatus,
)
from engine.runtime.commands import CommandRefused, PauseWait, refusal

Emit = Callable[[Event], None]


@dataclass
class Proposal:
    decision: Decision
    event: ProposalEvent  # as sent, pending

    @property
    def id(self) -> str:
        return self.event.id


class Approvals:
    def __init__(self, policy: FaultPolicy, wait: PauseWait, emit: Emit):
        self.policy, self.wait, self.emit = policy, wait, emit
        self.pending: Proposal | None = None
        self.decided: Decision | None = None  # answered while training on: carried out next
        self.answered: dict[str, str] = {}  # proposal id -> how it was decided
        self.count = 0

    def review(self, decision: Decision | None, anomalies: list[Anomaly], step: int,
               now: float) -> Decision | None:
        """The decision the loop carries out at `step` (collective when it holds)."""
        if self.pending is not None and now >= self.pending.event.deadline:
            self._time_out(step)
        settled, self.decided = self.decided, None
        if settled is not None:  # a person's answer (or the timeout) outranks this step's own
            return dataclasses.replace(settled, step=step)
        if decision is not None and "needs_attention" in decision.params:
            self.ask(decision, anomalies, now)
            return decision
        if decision is None or decision.action not in self.policy.approve:
            return decision
        if self.pending is not None:  # one proposal at a time: the later one is only seen
            return dataclasses.replace(decision, action=ActionName.OBSERVE, params={},
                                       reason=f"awaiting the answer to {self.pending.id}")
        self._propose(decision, anomalies, now)
        if self.policy.approve_while == "observe":
            return dataclasses.replace(decision, action=ActionName.OBSERVE, params={},
                                       reason=f"proposed {decision.action} ({self.pending.id}); "
                                       "training on while it waits")
        return self._hold(step, now)

    def ask(self, decision: Decision, anomalies: list[Anomaly], now: float) -> None:
        """Raise the proposal of a decision that `needs_attention`, whether it is the step's
        strongest or only recorded beside the one carried out (that answer does not help this
        anomaly either). The run trains on as it is while a person looks; one at a time."""
        if "needs_attention" in decision.params and self.pending is None:
            self._propose(dataclasses.replace(decision, action=decision.params[
                "needs_attention"], params={}), anomalies, now, attention=decision.reason)

    def _propose(self, decision: Decision, anomalies: list[Anomaly], now: float,
                 attention: str | None = None) -> None:
        """Raise a proposal of `decision`; with `attention` (why) one the ladder raised
        itself, which never holds the run and by default leaves it as it is."""
        self.count += 1
        cause = next((a for a in anomalies if a.kind == decision.anomaly), None)
        event = ProposalEvent(
            step=decision.step, id=f"p-{decision.step}-{self.count}",
            status=ProposalStatus.PENDING, action=decision.action, anomaly=decision.anomaly,
            deadline=now + self.policy.approve_timeout_s,
            default=ActionName.OBSERVE if attention else self._default(decision),
            hold=not attention and self.policy.approve_while == "hold", rank=decision.rank,
            evidence=cause.evidence if cause is not None else {}, reason=attention)
        self.pending = Proposal(decision, event)
        self.emit(event)

    def _default(self, decision: Decision) -> str:
        default = self.policy.approve_default
        return decision.action if default == PROPOSED else default

    def _hold(self, step: int, now: float) -> Decision | None:
        """Wait at the step boundary for the answer; past the deadline take the default.
        Other commands that arrive meanwhile are carried out after this step."""
        max_s = max(self.pending.event.deadline - now, 0.0)
        with self.wait.held():
            for commands in self.wait.arrivals(step, max_s):
                for command in commands:
                    if command.kind == CommandKind.DECIDE:
                        self.answer(command, step)
                    else:
                        self.wait.inbox.deferred.append(command)
                if self.decided is not None:
                    break
        if self.pending is not None:
            self._time_out(step)
        settled, self.decided = self.decided, None
        return settled

    def answer(self, command: Command, step: int) -> None:
        """Carry out a `decide` command, answering it with an `action` event naming its id,
        or refuse it with the reason."""
        try:
            choice, take = self._choice(command.args)
        except CommandRefused as e:
            self.emit(refusal(step, command, str(e)))
            return
        self._settle(step, choice, take, by=f"command {command.id}", command=command.id)
        self.emit(ActionEvent(step=step, action=str(command.kind), command=command.id,
                              by=ActionBy.COMMAND, details={"proposal": command.args["proposal"],
                                                            "choice": choice, "take": take}))

    def _choice(self, args: dict) -> tuple[str, str]:
        """(status, action to take) for a `decide` command's args; CommandRefused naming why."""
        pid, choice = args.get("proposal"), args.get("choice")
        if self.pending is None or pid != self.pending.id:
            if isinstance(pid, str) and pid in self.answered:
                raise CommandRefused(f"decide: proposal {pid} is no longer pending: "
                                     f"{self.answered[pid]}")
            raise CommandRefused(f"decide: args.proposal: no pending proposal {pid!r}")
        if choice == Choice.APPROVE:
            return ProposalStatus.APPROVED, self.pending.decision.action
        if choice == Choice.DISMISS:
            return ProposalStatus.DISMISSED, "observe"
        if choice == Choice.CHOOSE and args.get("action") in LADDER_ACTIONS:
            return ProposalStatus.CHOSEN, args["action"]
        raise CommandRefused(f"decide: args.choice must be one of {', '.join(Choice)}; "
                             f"{Choice.CHOOSE} names args.action, one of "
                             f"{', '.join(LADDER_ACTIONS)}")

    def _time_out(self, step: int) -> None:
        self._settle(step, ProposalStatus.TIMED_OUT, self.pending.event.default, by="timeout")

    def _settle(self, step: int, status: str, take: str, by: str,
                command: str | None = None) -> None:
        proposal, self.pending = self.pending, None
        self.answered[proposal.id] = f"{status} by {by} at step {step}"
        # another action than the proposed one carries its own defaults (verdict_for)
        self.decided = dataclasses.replace(
            proposal.decision, action=take, reason=f"{proposal.id} {status} by {by}",
            params=proposal.decision.params if take == proposal.decision.action else {})
        self.emit(dataclasses.replace(proposal.event, step=step, status=status, take=take,
                                      by=by, command=command))
