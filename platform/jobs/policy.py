"""The platform's fault policy: what the platform does above the engine's own ladder.

The engine answers each anomaly on its own (skip, retry, LR cut, rollback, restart: see
engine/anomaly). The platform watches those answers and the run's end, per job:

- `max_auto_actions_per_hour` (default 10): when the engine's fault policy has acted that
  many times within an hour (observing does not count), the platform pauses the job for a
  person and notifies its webhooks (`policy.pause`). Only actions since the job last resumed
  from a pause count: the person who resumed it has looked, so the actions that led to the
  pause do not pause it again. 0 turns this off.
- `resume_on_failure` (default 0): a run that fails (a crash beyond the engine's own restarts)
  is queued again to resume from its newest checkpoint, up to this many times
  (`policy.resume`), before the failure stands.

A job's `platform` object (beside the spec in the create body) sets them; errors name the field.
The job's supervisor hands this module the engine's policy actions (`auto_pause`), its
checkpoints (`storage_pause`: its owner's checkpoint storage quota, jobs.models.Quota) and the
run's failure (`auto_resume`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from engine.contract import ActionBy, ActionEvent, ActionName
from jobs.commands import issue
from jobs.dispatch import dispatch
from jobs.launch import resume_point
from jobs.models import (
    Cause,
    Checkpoint,
    CommandKind,
    IllegalTransition,
    Job,
    JobEvent,
    Quota,
    State,
)
from jobs.telemetry import telemetry
from jobs.webhooks import notify

POLICY_ACTOR = "platform policy"
AUTO_ACTION_WINDOW_S = 3600.0
# answers that change nothing the run computes: they do not count toward the hourly limit (a
# rebalance moves samples between ranks, and follows their speeds with a change every few
# steps while a straggler lasts, but the updates stay those of even shares)
PASSIVE_ACTIONS = frozenset({ActionName.OBSERVE, ActionName.REFUSED, ActionName.REBALANCE})
# a job leaving one of these states for queued or running was resumed by a person
RESUMED_FROM = (State.PAUSED, State.PAUSED_WARM)


class PolicyError(ValueError):
    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))


@dataclass(frozen=True)
class PlatformPolicy:
    max_auto_actions_per_hour: int = 10
    resume_on_failure: int = 0

    @classmethod
    def parse(cls, data: Any) -> PlatformPolicy:
        """From a job's `platform` object; PolicyError names each bad field."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise PolicyError({"platform": "must be an object"})
        known = {f.name for f in dataclasses.fields(cls)}
        errors = {f"platform.{k}": "unknown field" for k in data if k not in known}
        for name in known & set(data):
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                errors[f"platform.{name}"] = "must be a non-negative integer"
        if errors:
            raise PolicyError(errors)
        return cls(**data)

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def wants_pause(self, recent_auto_actions: int) -> bool:
        """Has the engine acted on its own often enough that a person should look?"""
        return 0 < self.max_auto_actions_per_hour <= recent_auto_actions

    def wants_resume(self, resumes_so_far: int) -> bool:
        return resumes_so_far < self.resume_on_failure


def policy_of(job: Job) -> PlatformPolicy:
    return PlatformPolicy.parse(job.platform or None)


def counted_since(job: Job) -> float:
    """Where the hourly window of `max_auto_actions_per_hour` begins (epoch seconds): an hour
    ago, or when the job last resumed from a pause (cold: queued again; warm: running again),
    whichever is later."""
    resumed = JobEvent.objects.filter(job=job, from_state__in=RESUMED_FROM,
                                      to_state__in=(State.QUEUED, State.RUNNING)).last()
    hour_ago = time.time() - AUTO_ACTION_WINDOW_S
    return max(hour_ago, resumed.time.timestamp()) if resumed else hour_ago


def auto_pause(job: Job, event: ActionEvent) -> None:
    """After an action of the engine's own fault policy: pause the running job for a person if
    the engine acted on its own too often within the hour."""
    if event.by != ActionBy.POLICY or event.action in PASSIVE_ACTIONS:
        return
    recent = telemetry().policy_actions_since(job.pk, counted_since(job), PASSIVE_ACTIONS)
    policy = policy_of(job)
    job.refresh_from_db(fields=["state"])
    if not policy.wants_pause(recent) or job.state != State.RUNNING:
        return
    _pause(job, f"the engine's fault policy acted {recent} times within an hour (limit "
                f"{policy.max_auto_actions_per_hour}): paused for a person", auto_actions=recent)


def storage_pause(job: Job) -> None:
    """After a checkpoint of the running job: pause it when its owner's stored checkpoints
    (those retention has not deleted) are over their checkpoint storage quota. Nothing is
    deleted: the owner deletes what they choose, or staff raise the quota."""
    limit = Quota.limits_of(job.owner).checkpoint_bytes
    if limit is None:
        return
    stored = Checkpoint.stored_bytes_of(job.owner_id)
    job.refresh_from_db(fields=["state"])
    if stored <= limit or job.state != State.RUNNING:
        return
    _pause(job, f"its owner's stored checkpoints take {stored:,} bytes, over their checkpoint "
                f"storage quota of {limit:,} bytes: paused, nothing deleted",
           checkpoint_bytes=stored)


def _pause(job: Job, reason: str, **details: int) -> None:
    """Pause the running job for `reason` as the platform's policy, and tell its webhooks."""
    try:
        issue(job, CommandKind.PAUSE, {"reason": reason}, actor=POLICY_ACTOR, cause=Cause.POLICY,
              engine_args={})
    except IllegalTransition:
        return
    notify(job, "policy.pause", {"reason": reason, **details})


def auto_resume(job: Job, reason: str) -> bool:
    """The run failed for `reason`: queue it again to resume from its newest checkpoint if the
    policy allows another resume and there is a checkpoint; whether it did."""
    resumes = JobEvent.objects.filter(job=job, cause=Cause.POLICY,
                                      to_state=State.QUEUED).count()
    policy = policy_of(job)
    if not policy.wants_resume(resumes) or resume_point(job) is None:
        return False
    with transaction.atomic():
        job.requeue(Cause.POLICY, f"{reason}; the platform policy resumes it from its newest "
                    f"checkpoint (resume {resumes + 1} of {policy.resume_on_failure})",
                    actor=POLICY_ACTOR)
        dispatch(job)
    notify(job, "policy.resume", {"reason": reason, "resume": resumes + 1})
    return True
