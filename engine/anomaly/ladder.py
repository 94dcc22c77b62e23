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
one, and past the top the job pauses for a person.

What the loop does for each action: observe - record only; skip_update - drop this step's
gradients and do not step the optimizer; retry_step - drop them and run the same step on the
same data again; lr_cut - redo the step with the learning rate times `lr_factor`; checkpoint -
save now; rebalance - shares of the batch that follow the ranks' speeds (engine.runtime.
rebalance); rollback - load the last good checkpoint and skip the data window since then;
exclude - train on while the platform drains the straggler's host and moves the job off it
(a job on one host restarts instead); restart - snapshot this step to the memory tier and
restart the ranks from it; pause - checkpoint, stop, wait for a person.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.anomaly.anomaly import KINDS, Anomaly
from engine.anomaly.policy import ACTIONS, FaultPolicy, policy_ladders
from engine.anomaly.policy import LADDER_ACTIONS as LADDER_ACTIONS  # re-exported for the platform


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
                "rank": self.rank, "by": "policy", "reason": self.reason, **self.params}


class ResponseLadder:
    def __init__(self, policy: FaultPolicy | None = None, reset_after: int = 100,
                 retries_per_step: int = 1, rollbacks_per_hour: int = 2,
                 lr_factor: float = 0.1, hosts: int = 1):
        """`hosts`: how many hosts the job runs on (on one, `exclude` restarts instead)."""
        policy = policy or FaultPolicy()
        self.hosts = hosts
        self.ladders = policy_ladders(policy, hosts)
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

    def set_ladders(self, policy: FaultPolicy) -> None:
        self.ladders = policy_ladders(policy, self.hosts)

    def decide(self, anomalies: list[Anomaly], step: int, now: float) -> list[Decision]:
        """One decision per anomaly kind present, strongest first. `now` is wall-clock seconds
        agreed by all ranks (`agree_anomalies` returns it), so caps decide alike everywhere."""
        decisions = []
        first_of_kind: dict[str, Anomaly] = {}
        for a in anomalies:
            first_of_kind.setdefault(a.kind, a)
        for kind in sorted(first_of_kind, key=KINDS.index):
            ladder = self.ladders[kind]
            last = self.last_step.get(kind)
            repeat = last is not None and step - last <= self.reset_after
            rung = self.rung.get(kind, -1) + 1 if repeat else 0
            reason = "repeat within the window" if repeat and rung else "first occurrence"
            while rung < len(ladder) and self._capped(ladder[rung], kind, step, now):
                reason = self._cap_reason(ladder[rung], kind)
                rung += 1
            if rung < len(ladder):
                action = ladder[rung]
            else:  # past the top a person is paged, unless the ladder only ever watches
                action = "observe" if ladder[-1] == "observe" else "pause"
            self.rung[kind] = min(rung, len(ladder) - 1)
            self.last_step[kind] = step
            self._use(action, kind, step, now)
            params = {"lr_factor": self.lr_factor} if action == "lr_cut" else {}
            decisions.append(Decision(action, kind, step, rung, first_of_kind[kind].rank,
                                      reason, params))
        return sorted(decisions, key=lambda d: ACTIONS.index(d.action), reverse=True)

    def _capped(self, action: str, kind: str, step: int, now: float) -> bool:
        if action == "retry_step":
            return self.retries.get(step, 0) >= self.retries_per_step
        if action == "rollback":
            recent = [t for t in self.rollback_times if now - t < 3600]
            return len(recent) >= self.rollbacks_per_hour
        if action == "restart":
            return len(self._recent_restarts(kind, now)) >= self.policy_restarts
        return False

    def _cap_reason(self, action: str, kind: str) -> str:
        if action == "restart":
            return (f"restart capped: {self.policy_restarts} for {kind} within "
                    f"{self.restart_window_s:g} s")
        return f"{action} capped"

    def _recent_restarts(self, kind: str, now: float) -> list[float]:
        return [t for t in self.restart_times.get(kind, []) if now - t < self.restart_window_s]

    def _use(self, action: str, kind: str, step: int, now: float) -> None:
        if action == "retry_step":
            self.retries = {step: self.retries.get(step, 0) + 1}  # only the current step counts
        elif action == "rollback":
            self.rollback_times = [t for t in self.rollback_times if now - t < 3600] + [now]
        elif action == "restart":
            self.restart_times[kind] = self._recent_restarts(kind, now) + [now]

    def state_dict(self) -> dict[str, Any]:
        return {"rung": dict(self.rung), "last_step": dict(self.last_step),
                "retries": {str(k): v for k, v in self.retries.items()},
                "rollback_times": list(self.rollback_times),
                "restart_times": {k: list(v) for k, v in self.restart_times.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rung = dict(state["rung"])
        self.last_step = dict(state["last_step"])
        self.retries = {int(k): v for k, v in state["retries"].items()}
        self.rollback_times = list(state["rollback_times"])
        # checkpoints from before the policy's restarts were counted per kind have none
        self.restart_times = {k: list(v) for k, v in state.get("restart_times", {}).items()}
