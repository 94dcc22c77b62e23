"""The `job` message: what the job socket and the list socket say about a job's state."""

from __future__ import annotations

from typing import Any

from jobs.models import Job, JobEvent


def job_message(job: Job, seq: int, change: JobEvent | None = None) -> dict[str, Any]:
    """The job's state, with the transition that made it (`change`: when, from which state,
    its cause and actor) if there is one. `seq` is the socket's: the newest event a job socket
    may hold, the state-history row on the list socket."""
    message = {"type": "job", "seq": seq, "job": job.pk, "name": job.name, "state": job.state,
               "step": job.step, "total_steps": job.total_steps, "error": job.error}
    if change is not None:
        message.update(state=change.to_state, from_state=change.from_state, cause=change.cause,
                       actor=change.actor, message=change.message,
                       time=change.time.isoformat())
    return message
