"""What places and launches a job: Ringside's own hosts (`hosts`) or the cluster's scheduler
(`slurm`), behind one small interface.

A backend `start`s one incarnation of a placed job and hands the supervisor (jobs.supervisor) a
`Launched`: something to `poll` until the launch ends (its exit code then), and to signal
(`signal_all`: SIGTERM to stop, SIGKILL to end it now). `release` gives back what the
incarnation held. Placement differs most: the hosts backend reserves slots on registered hosts
(jobs.placement); the Slurm backend hands placement to Slurm (jobs.backends.slurm) and
follows a launch across the Slurm jobs it takes (jobs.backends.slurm_run). Events and
commands go over the same Redis bus either way, so the job page, steering and the fault policy
do not know which backend runs a job.

The operator picks the default (RINGSIDE_BACKEND); a job may name its own (`backend` beside the
spec in the create body, with its options: `slurm: {partition, account, qos, time_limit, gres,
constraint}`), validated with errors that name the field (jobs.backends.options).
"""

from __future__ import annotations

from jobs.backends import hosts, slurm_run
from jobs.backends.base import NAMES, Backend, Launched, LaunchRefused
from jobs.models import Job

__all__ = ["NAMES", "Backend", "Launched", "LaunchRefused", "of"]


def of(job: Job) -> Backend:
    """The backend that runs `job`."""
    return slurm_run.BACKEND if job.backend == "slurm" else hosts.BACKEND
