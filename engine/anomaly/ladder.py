"""The response ladder: which action answers an anomaly, escalating on repeats, with caps.

    ladder = ResponseLadder(spec.faults.policy)
    for d in ladder.decide(agreed_anomalies, step, now):      # identical input on every rank
        ...  # rank 0 publishes each as an `action` event (runtime.response.decision_event)
    # carry out decisions[0].action (the strongest); the rest are recorded

Each kind has a ladder of actions (policy.DEFAULT_LADDERS, overridden per kind by
`faults.policy.actions`). The first anomaly of a kind takes the first rung; another of the
same kind within `reset_after` steps takes the next one; `reset_after` quiet steps start
over. Caps (spec §7): at most `retries_per_step` retries of a step, `rollbacks_per_hour`
rollbacks, `policy_restarts` restarts for one kind within `policy_restart_window_s` (apart
from the launcher's crash restarts, `max_restarts`); a capped rung is passed over for the next
one, and past the top the job pauses for a person. A rung that cannot help against the
cause (`cannot_help`: an `exclude` on one host, a `restart` for a straggler) is skipped, said
so in the decision; when that leaves only `pause`, the run goes on as it is (observe) and a
person is asked instead (`needs_attention`: runtime.approvals raises a proposal).

What the loop does for each action: observe - record only; skip_update - drop this step's
gradients and do not step the optimizer; retry_step - drop them and run the same step on the
same data again; lr_cut - redo the step with the learning rate times `lr_factor`; checkpoint -
save now; rebalance - shares of the batch that follow the ranks' speeds (engine.runtime.
rebalance); rollback - load the last good checkpoint and skip the data window since then;
exclude - train on while the platform drains the straggler's host and moves the job off it;
restart - snapshot the last step to the memory tier and restart the ranks from it; pause -
checkpoint, stop, wait for a person.

rerun (for the anomalies found before the update: loss_spike, nan) trains the step again on
the same data from the same state: a spike that comes back is the batch's (it is recorded and
skipped), one that does not is the step's (it goes on with the rerun's result, and the ranks
whose results differed are `sdc_suspect` anomalies: engine.runtime.rerun).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.anomaly.anomaly import KINDS, Anomaly
from engine.anomaly.policy import ACTIONS, FaultPolicy, policy_ladders
from engine.anomaly.policy import LADDER_ACTIONS as LADDER_ACTIONS  # re-exported for the platform
from engine.contract import ActionBy, ActionName, AnomalyKind


@dataclass
class Decision:
    action: str
    anomaly: str  # the kind it answers
    step: int
    rung: int  # 0-based position reached on the kind's ladder
    rank: int | None = None
    reason: str = ""
    params: dict[str, Any] = field(default_factory=dict)

    def event_fields(self) -> dict[str, Any]:
        """The decision's fields as its `action` event carries them on the wire."""
        return {"action": self.action, "anomaly": self.anomaly, "rung": self.rung,
                "rank": self.rank, "by": ActionBy.POLICY, "reason": self.reason, **self.params}


def cannot_help(action: str, kind: str, hosts: int) -> str | None:
    """Why the rung `action` cannot help against an anomaly of `kind` in a job on `hosts`
    hosts; None when it may. A rung that cannot help is skipped."""
    if action == ActionName.EXCLUDE and hosts < 2:
        return "the job runs on one host, with no other to move to"
    if action == ActionName.RESTART and kind == AnomalyKind.STRAGGLER:
        return "the ranks restart on the same hosts, where the straggler stays slow"
    return None


class ResponseLadder:
    def __init__(self, policy: FaultPolicy | None = None, reset_after: int = 100,
                 retries_per_step: int = 1, rollbacks_per_hour: int = 2,
                 lr_factor: float = 0.1, hosts: int = 1):
        """`hosts`: how many hosts the job runs on (on one, `exclude` cannot help)."""
        policy = policy or FaultPolicy()
        self.hosts = hosts
        self.ladders = policy_ladders(policy)
        self.policy_restarts = policy.policy_restarts
        self.restart_window_s = policy.policy_restart_window_s
        self.reset_after = reset_after
        self.retries_per_step = retries_per_step
        self.rollbacks_per_hour = rollbacks_per_hour
        self.lr_factor = lr_factor
        self.rung: dict[str, int] = {}
        self.last_step: dict[str, int] = {}
        self.retries: dict[int, int] = {}  # step -> retries taken
        self.rollback_times: list[float] = []
        self.restart_times: dict[str, list[float]] = {}  # kind -> when the policy restarted
        self.attention: dict[str, int] = {}  # kind -> the step a person was asked at

    def set_ladders(self, policy: FaultPolicy) -> None:
        self.ladders = policy_ladders(policy)

    def decide(self, anomalies: list[Anomaly], step: int, now: float) -> list[Decision]:
        """One decision per anomaly kind present, strongest first. `now` is wall-clock seconds
        agreed by all ranks (`agree_anomalies` returns it), so caps decide alike everywhere."""
        first_of_kind: dict[str, Anomaly] = {}
        for a in anomalies:
            first_of_kind.setdefault(a.kind, a)
        decisions = [self._decide_kind(kind, first_of_kind[kind], step, now)
                     for kind in sorted(first_of_kind, key=KINDS.index)]
        return sorted(decisions, key=lambda d: ACTIONS.index(d.action), reverse=True)

    def _decide_kind(self, kind: str, anomaly: Anomaly, step: int, now: float) -> Decision:
        ladder = self.ladders[kind]
        last = self.last_step.get(kind)
        # a straggler named anew, not `persisting`, is another episode (ranks sharing busy
        # cores drift apart for a while): rebalancing answers it again; only one that
        # rebalancing did not bring back climbs the ladder
        repeat = (last is not None and step - last <= self.reset_after
                  and anomaly.evidence.get("persisting") is not False)
        self.last_step[kind] = step
        if not repeat:
            self.attention.pop(kind, None)
        elif kind in self.attention:  # a person was asked; until then what is in force holds
            return Decision(ActionName.OBSERVE, kind, step, self.rung[kind], anomaly.rank,
                            f"needs attention (asked at step {self.attention[kind]})")
        rung = self.rung.get(kind, -1) + 1 if repeat else 0
        reasons = ["repeat within the window" if repeat and rung else "first occurrence"]
        skipped = []
        while rung < len(ladder):
            if (why := cannot_help(ladder[rung], kind, self.hosts)) is not None:
                skipped.append(ladder[rung])
                reasons.append(f"{ladder[rung]} skipped: {why}")
            elif self._capped(ladder[rung], kind, step, now):
                reasons[0] = self._cap_reason(ladder[rung], kind)
            else:
                break
            rung += 1
        # past the top a person is paged, unless the ladder only ever watches
        action = ladder[rung] if rung < len(ladder) else (
            ActionName.OBSERVE if ladder[-1] == ActionName.OBSERVE else ActionName.PAUSE)
        self.rung[kind] = min(rung, len(ladder) - 1)
        params: dict[str, Any] = {"skipped": skipped} if skipped else {}
        if skipped and action == ActionName.PAUSE:
            # the answer that fits the cause cannot be given here: rather than stop the run,
            # keep what is in force (a straggler stays rebalanced) and ask a person
            self.attention[kind] = step
            params["needs_attention"] = action
            reasons.append("needs attention")
            action = ActionName.OBSERVE
        self._use(action, kind, step, now)
        if action == ActionName.LR_CUT:
            params["lr_factor"] = self.lr_factor
        return Decision(action, kind, step, rung, anomaly.rank, "; ".join(reasons), params)

    def _capped(self, action: str, kind: str, step: int, now: float) -> bool:
        if action == ActionName.RETRY_STEP:
            return self.retries.get(step, 0) >= self.retries_per_step
        if action == ActionName.ROLLBACK:
            recent = [t for t in self.rollback_times if now - t < 3600]
            return len(recent) >= self.rollbacks_per_hour
        if action == ActionName.RESTART:
            return len(self._recent_restarts(kind, now)) >= self.policy_restarts
        return False

    def _cap_reason(self, action: str, kind: str) -> str:
        if action == ActionName.RESTART:
            return (f"restart capped: {self.policy_restarts} for {kind} within "
                    f"{self.restart_window_s:g} s")
        return f"{action} capped"

    def _recent_restarts(self, kind: str, now: float) -> list[float]:
        return [t for t in self.restart_times.get(kind, []) if now - t < self.restart_window_s]

    def _use(self, action: str, kind: str, step: int, now: float) -> None:
        if action == ActionName.RETRY_STEP:
            self.retries = {step: self.retries.get(step, 0) + 1}  # only the current step counts
        elif action == ActionName.ROLLBACK:
            self.rollback_times = [t for t in self.rollback_times if now - t < 3600] + [now]
        elif action == ActionName.RESTART:
            self.restart_times[kind] = self._recent_restarts(kind, now) + [now]

    def state_dict(self) -> dict[str, Any]:
        # keys as plain strings (kinds are StrEnums): a checkpoint's extras never need the
        # contract's classes to be read
        return {"rung": {str(k): v for k, v in self.rung.items()},
                "last_step": {str(k): v for k, v in self.last_step.items()},
                "retries": {str(k): v for k, v in self.retries.items()},
                "rollback_times": list(self.rollback_times),
                "restart_times": {str(k): list(v) for k, v in self.restart_times.items()},
                "attention": {str(k): v for k, v in self.attention.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rung = dict(state["rung"])
        self.last_step = dict(state["last_step"])
        self.retries = {int(k): v for k, v in state["retries"].items()}
        self.rollback_times = list(state["rollback_times"])
        # checkpoints from before the policy's restarts were counted per kind have none
        self.restart_times = {k: list(v) for k, v in state.get("restart_times", {}).items()}
        self.attention = dict(state.get("attention", {}))
