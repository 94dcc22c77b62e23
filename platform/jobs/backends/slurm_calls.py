"""The calls the `slurm` backend makes to Slurm, however it makes them (through its clients,
jobs.backends.slurm's `Clients`, or its REST API, jobs.backends.slurm_rest): the `Slurm`
interface and what crosses it."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import NamedTuple, Protocol

from jobs.backends.base import LaunchRefused

CLIENT_TIMEOUT_S = 30
# Slurm's states in which the job may still run (a requeued job is pending again)
ALIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED",
                   "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "SIGNALING",
                   "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED"})


class SlurmError(LaunchRefused):
    """A Slurm client refused or failed; its message says what Slurm said."""


class Seen(NamedTuple):
    """What Slurm says of one of its jobs."""

    state: str
    reason: str  # why it is pending
    code: int  # its exit code once it ended (a signal's as its negative)
    nodes: str = ""  # the nodes it runs on, a Slurm node list (`hostnames` expands it)
    # when its time limit ends it (epoch seconds), while it runs, where Slurm does not warn it
    # (`Slurm.warns_of_time_limit`): the platform warns it then
    ends_at: float | None = None


class Partition(NamedTuple):
    """A partition's limits on one job (None: unlimited)."""

    name: str
    default: bool  # a job naming no partition runs in it
    max_nodes: int | None
    max_minutes: int | None


class Slurm(Protocol):
    """The calls the backend makes to Slurm, through its clients or its REST API; each raises
    SlurmError with Slurm's own word when Slurm refuses or fails."""

    # whether Slurm itself warns a running job of its time limit (the batch script's
    # `--signal`); where not, `look` reports when the job ends (`Seen.ends_at`)
    warns_of_time_limit: bool

    def submit(self, script: Path, options: dict[str, str | bool]) -> str:
        """Submit the batch `script` with `options` (`sbatch_options`); the Slurm job's id."""

    def look(self, slurm_id: str) -> Seen:
        """What Slurm says of `slurm_id`."""

    def hostnames(self, nodes: str) -> list[str]:
        """The node list of a `Seen` (compressed: `h[0-1]`) as names."""

    def cancel(self, slurm_id: str, sig: signal.Signals | None = None) -> None:
        """`sig` to every process of the job (its batch shell and steps); None: cancel it."""

    def lost_nodes(self, nodes: list[str]) -> list[str]:
        """Those of `nodes` Slurm holds down, failed, drained or not responding."""

    def node_down_within_s(self) -> float:
        """How long after a node fell silent Slurm may still be finding out."""

    def partitions(self) -> list[Partition]:
        """The cluster's partitions."""


# Slurm's defaults of the timeouts `down_within_s` reads
SLURM_DEFAULTS = {"SlurmdTimeout": "300", "MessageTimeout": "10"}


def down_within_s(config: dict[str, str]) -> float:
    """How long after a node fell silent Slurm may still be finding out: its SlurmdTimeout
    (how long it waits for a silent node), then a ping's MessageTimeout (a ping to a dead node
    fails only that late), each twice (Slurm marks it down at a ping after the one that found
    it silent)."""
    return 2 * (float(config["SlurmdTimeout"]) + float(config["MessageTimeout"]))
