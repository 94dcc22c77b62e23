"""The `job` message: what the job socket and the list socket say about a job's state."""

from __future__ import annotations

from typing import Any

from jobs.models import Job, JobEvent
from jobs.serializers import PlacementSerializer


def job_message(job: Job, seq: int, change: JobEvent | None = None) -> dict[str, Any]:
    """The job's state, with the transition that made it (`change`: when, from which state,
    its cause and actor) if there is one, and where and since when it runs as the job's detail
    has them (a page needs no other read to show the change). `seq` is the socket's: the
    newest event a job socket may hold, the state-history row on the list socket."""
    message = {"type": "job", "seq": seq, "job": job.pk, "name": job.name, "state": job.state,
               "step": job.step, "total_steps": job.total_steps, "error": job.error,
               **_whereabouts(job)}
    if change is not None:
        message.update(state=change.to_state, from_state=change.from_state, cause=change.cause,
                       actor=change.actor, message=change.message,
                       time=change.time.isoformat())
    return message


def _whereabouts(job: Job) -> dict[str, Any]:
    return {"placement": PlacementSerializer(job.placement, many=True).data,
            "waiting_reason": job.waiting_reason,
            "started_at": job.started_at and job.started_at.isoformat(),
            "finished_at": job.finished_at and job.finished_at.isoformat()}
