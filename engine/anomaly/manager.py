"""The loop's one call per step: detect on this rank, agree across ranks, decide.

    faults = FaultManager(spec.faults.policy, rank)           # every rank
    watchdog = HangWatchdog(timer, spec.faults.policy.hang_timeout_s, run_dir / "hangs",
                            on_hang=faults.report)
    ...
    # each step, after the gradient norm is known and before the optimizer step:
    anomalies, decisions = faults.step(step, loss=local_loss, grad_norm=grad_norm,
                                       tokens_per_s=prev.tokens_per_s,
                                       memory_bytes=prev_local_rss, aggregate=prev_ops,
                                       experts=prev_experts)
    # rank 0 publishes every anomaly and decision; all ranks carry out decisions[0].action

The throughput, memory, timing and expert signals may be the previous step's (they are
known only once a step has ended); NaN and spikes are caught in the step they happen.
"""

from __future__ import annotations

import collections
from typing import Any

from engine.anomaly.agree import agree_anomalies
from engine.anomaly.anomaly import Anomaly
from engine.anomaly.detectors import Detectors
from engine.anomaly.ladder import Decision, ResponseLadder
from engine.anomaly.policy import FaultPolicy


class FaultManager:
    def __init__(self, policy: FaultPolicy | None = None, rank: int = 0, group: Any = None,
                 hosts: int = 1):
        self.detectors = Detectors(policy, rank)
        self.ladder = ResponseLadder(policy, hosts=hosts)
        self.group = group
        self._reported: collections.deque[Anomaly] = collections.deque()
        self.now = 0.0  # the wall clock the ranks agreed on in the last `step`

    def set_policy(self, policy: FaultPolicy) -> None:
        """New thresholds and ladders from the next step on; what the detectors have seen and
        the rungs reached so far are kept."""
        self.detectors.set_thresholds(policy)
        self.ladder.set_ladders(policy)

    def report(self, anomaly: Anomaly) -> None:
        """Queue an anomaly found elsewhere (the watchdog's thread); safe from any thread.
        It joins the next `step`'s agreement."""
        self._reported.append(anomaly)

    def step(self, step: int, *, loss: float | None = None, grad_norm: float | None = None,
             tokens_per_s: float | None = None, memory_bytes: float | None = None,
             aggregate: dict[str, Any] | None = None,
             experts: dict[str, Any] | None = None) -> tuple[list[Anomaly], list[Decision]]:
        """Collective over `group`: the anomalies every rank found, and the decisions,
        strongest first, identical on every rank."""
        found = self.detectors.check_step(step, loss=loss, grad_norm=grad_norm,
                                          tokens_per_s=tokens_per_s, memory_bytes=memory_bytes)
        if aggregate is not None:
            found += self.detectors.check_ops(step, aggregate)
        if experts is not None:
            found += self.detectors.check_experts(step, experts)
        while self._reported:
            found.append(self._reported.popleft())
        agreed, self.now = agree_anomalies(found, self.group)
        return agreed, self.ladder.decide(agreed, step, self.now)

    def state_dict(self) -> dict[str, Any]:
        return {"detectors": self.detectors.state_dict(), "ladder": self.ladder.state_dict()}

    def load_state_dict(self, state: dict[str, Any], ladder: bool = True) -> None:
        """`ladder=False` on a rollback inside a running job: the live ladder remembers the
        rollbacks and retries just taken, which the older checkpoint does not."""
        self.detectors.load_state_dict(state["detectors"])
        if ladder:
            self.ladder.load_state_dict(state["ladder"])
