"""The fault policy's proposals: actions that wait for a person (`faults.policy.approve`).

The engine publishes a `proposal` event when one is made and again when it is decided
(engine.runtime.approvals); the stored events are the record, each proposal as its latest
event tells it. A proposal fires the job's `proposal` webhook; a person's decision is a
`decide` command (audited as `job.decide` when issued), the timeout's is audited here when the
engine reports it.
"""

from __future__ import annotations

from typing import Any

from engine.contract import Header, ProposalEvent, ProposalStatus
from jobs.models import AuditEntry, Cause, Job
from jobs.telemetry import telemetry
from jobs.webhooks import notify

ENGINE_ACTOR = "engine"  # who takes the default when nobody answered


def proposals(job: Job) -> list[dict[str, Any]]:
    """The job's proposals, oldest first, each as its latest event says."""
    latest: dict[str, dict[str, Any]] = {}
    for data in telemetry().events_data(job.pk, ProposalEvent.type):
        latest[str(data.get("id"))] = data  # a later word replaces an earlier one in place
    return list(latest.values())


def find(job: Job, proposal_id: str) -> dict[str, Any] | None:
    return next((p for p in proposals(job) if p.get("id") == proposal_id), None)


def why_not_pending(proposal: dict[str, Any]) -> str:
    """What became of a proposal that is no longer pending."""
    return (f"proposal {proposal['id']} is no longer pending: {proposal['status']} by "
            f"{proposal.get('by')} at step {proposal['step']} (took {proposal.get('take')})")


def on_event(job: Job, event: ProposalEvent) -> None:
    """A stored `proposal` event: tell the webhooks of a new one, audit a timeout."""
    if event.status == ProposalStatus.PENDING:
        notify(job, "proposal", {k: v for k, v in event.to_dict().items()
                                 if k not in (Header.TYPE, Header.JOB, Header.TIME, Header.SEQ)})
    elif event.status == ProposalStatus.TIMED_OUT:
        AuditEntry.record("proposal.timeout", ENGINE_ACTOR, Cause.ENGINE, job=job,
                          proposal=event.id, proposed=event.action, take=event.take,
                          step=event.step)
