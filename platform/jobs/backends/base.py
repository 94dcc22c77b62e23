"""The interface every backend implements (jobs.backends says how they differ)."""

from __future__ import annotations

import signal
from typing import Protocol

from jobs.membership import Peers
from jobs.models import Job

NAMES = ("hosts", "slurm")


class LaunchRefused(RuntimeError):
    """The backend would not start the job (Slurm refused the submission, say): the job fails
    with this message."""


class Launched(Protocol):
    """One started incarnation of a job's engine."""

    returncode: int | None

    @property
    def ref(self) -> str: ...  # how the logs name it (a pid, a Slurm job id)

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...

    def signal_all(self, sig: signal.Signals) -> None: ...


class Backend(Protocol):
    def start(self, job: Job) -> tuple[Launched, Peers | None]: ...

    def release(self, job: Job) -> None: ...
