"""The fault response: the detectors and the ladder judge each step, and one verdict says what
the loop does with its update.

Every rank runs `judge` (it is collective: the ranks agree on the anomalies) and gets the same
verdict; rank 0 publishes the anomalies and the decisions. The loop applies the verdict in one
place and calls `announce` once it is carried out, with what it did. A decision that waits for
a person (`faults.policy.approve`) goes through `Approvals.review` first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.anomaly import Anomaly, Decision, FaultManager
from engine.contract import (
    ActionBy,
    ActionEvent,
    ActionName,
    AnomalyEvent,
    AnomalyKind,
    BadBatchEvent,
    Event,
    RerunCause,
)
from engine.runtime.approvals import Approvals
from engine.runtime.rerun import Attribution

Emit = Callable[[Event], None]


@dataclass(frozen=True)
class Verdict:
    """What the loop does with a step's update; `decision` is the ladder's (None: no anomaly)."""

    decision: Decision | None = None


@dataclass(frozen=True)
class Apply(Verdict):
    """Step the optimizer, with the learning rate times `lr_factor`, then checkpoint if asked;
    with `rebalance` the ranks' shares of the batch follow their speeds from then on."""

    lr_factor: float = 1.0
    checkpoint: bool = False
    rebalance: bool = False


@dataclass(frozen=True)
class Discard(Verdict):
    """Drop the gradients and take the step count back by `step_back`; with `rewind_data` the
    step is trained again on the same data."""

    step_back: int = 1
    rewind_data: bool = False


@dataclass(frozen=True)
class Rerun(Verdict):
    """Train the step again on the same data from the same state (engine.runtime.rerun), then
    `FaultResponse.settle_rerun` says what follows. `ranks`: those the anomaly was found on
    (empty: a global signal, every rank)."""

    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Rollback(Verdict):
    """Drop the gradients, go back to the newest checkpoint before this step and skip the data
    since then."""


@dataclass(frozen=True)
class Stop(Verdict):
    """Drop the gradients, checkpoint the last step and end the run with `outcome`: "pause",
    or "restart" (the launcher starts the ranks again at once, from that checkpoint)."""

    outcome: str = "pause"


def verdict_for(decision: Decision | None) -> Verdict:
    """The one verdict for the ladder's strongest decision. The actions that only a person or
    the platform carries out (resume, reshard, cancel) leave the update applied."""
    action = decision.action if decision is not None else "observe"
    if action in ("skip_update", "retry_step"):  # the step number is trained again
        return Discard(decision, step_back=1, rewind_data=action == "retry_step")
    if action == "rerun":
        return Rerun(decision)
    if action == "lr_cut":
        return Apply(decision, lr_factor=float(decision.params.get("lr_factor", 0.1)))
    if action == "checkpoint":
        return Apply(decision, checkpoint=True)
    if action == "rebalance":
        return Apply(decision, rebalance=True)
    if action == "rollback":
        return Rollback(decision)
    if action in ("pause", "restart"):
        return Stop(decision, outcome=action)
    return Apply(decision)


def decision_event(decision: Decision, **outcome: Any) -> ActionEvent:
    """The `action` event of a policy decision, with what carrying it out did."""
    return ActionEvent(step=decision.step, action=decision.action, by=ActionBy.POLICY,
                       anomaly=decision.anomaly, rung=decision.rung, rank=decision.rank,
                       reason=decision.reason, details={**decision.params, **outcome})


class FaultResponse:
    """Runs the fault manager once per step on the signals of the step before (throughput,
    memory, timings and routing are known only once a step has ended) and this step's loss."""

    def __init__(self, faults: FaultManager, emit: Emit, approvals: Approvals | None = None):
        self.faults = faults
        self.emit = emit
        self.approvals = approvals
        self.signals: dict[str, Any] = {}  # the last completed step's
        self.found = False  # whether the last judged step raised anomalies

    def observe(self, grad_norm: float, tokens_per_s: float, rss: int, ops: dict,
                experts: list[dict]) -> None:
        """Record a completed step's signals for the next step's judgement."""
        self.signals = {"grad_norm": grad_norm, "tokens_per_s": tokens_per_s, "rss": rss,
                        "ops": ops, "experts": {str(i): layer for i, layer in enumerate(experts)}}

    def judge(self, step: int, local_loss: float) -> Verdict:
        """Collective: detect, agree, decide; publish what was found and every decision but
        the one carried out (announced by `announce`)."""
        # each completed step's signals are judged once; a discarded step leaves none
        prev, self.signals = self.signals, {}
        anomalies, decisions = self.faults.step(
            step, loss=local_loss, grad_norm=prev.get("grad_norm"),
            tokens_per_s=prev.get("tokens_per_s"), memory_bytes=prev.get("rss"),
            aggregate=prev.get("ops"), experts=prev.get("experts"),
        )
        self.found = bool(anomalies)
        for anomaly in anomalies:
            self.emit(AnomalyEvent(step=step, **anomaly.event_fields()))
        for decision in decisions[1:]:  # recorded; the first is announced once carried out
            self.emit(decision_event(decision))
        strongest = decisions[0] if decisions else None
        if self.approvals is not None:
            strongest = self.approvals.review(strongest, anomalies, step, self.faults.now)
            for recorded in decisions[1:]:
                self.approvals.ask(recorded, anomalies, self.faults.now)
        verdict = verdict_for(strongest)
        if isinstance(verdict, Rerun):
            ranks = {a.rank for a in anomalies if a.kind == strongest.anomaly}
            verdict = Rerun(strongest, ranks=tuple(sorted(ranks - {None})))
        return verdict

    def settle_rerun(self, verdict: Rerun, found: Attribution, samples: list[int],
                     windows: list[int]) -> Verdict:
        """What follows a rerun: the data's fault skips the batch (`samples`, the spiking
        ranks' part of the step, and their dataset `windows`) and records it; the step's goes
        on with the rerun's result. Every rank whose result differed is an `sdc_suspect`,
        which joins the next step's anomalies (and the ladder's decisions)."""
        assert verdict.decision is not None
        decision = dataclasses.replace(
            verdict.decision, params={**verdict.decision.params, **found.details()})
        for rank in found.differed:
            self.faults.report(Anomaly(AnomalyKind.SDC_SUSPECT, "error", decision.step, rank, {
                "rerun_step": decision.step, "loss": found.first[rank],
                "rerun_loss": found.again[rank]}))
        if found.cause is RerunCause.STEP:
            return Apply(decision)
        self.emit(BadBatchEvent(step=decision.step, anomaly=decision.anomaly,
                                ranks=found.spiking, samples=samples, windows=windows,
                                evidence={"loss": found.first, "rerun_loss": found.again}))
        return Discard(decision, step_back=1)

    def rebalanced(self, step: int, shares: list[int], reason: str) -> None:
        """Publish a change of the ranks' shares that the rebalancer made on its own."""
        self.emit(ActionEvent(step=step, action=ActionName.REBALANCE, by=ActionBy.POLICY,
                              anomaly=AnomalyKind.STRAGGLER, reason=reason,
                              details={"shares": shares}))

    def announce(self, verdict: Verdict, **outcome: Any) -> None:
        """Publish the decision carried out, with what it did (e.g. the checkpoint)."""
        if verdict.decision is not None:
            self.emit(decision_event(verdict.decision, **outcome))
