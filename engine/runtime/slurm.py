"""The engine under Slurm: its rendezvous read from the allocation, and the time limit's warning.

`srun` starts one launcher per allocated node (`python -m engine.train ... --rendezvous
slurm`); each reads the allocation from Slurm's environment: the nodes (`SLURM_JOB_NODELIST`,
Slurm's compressed list, expanded here as `scontrol show hostnames` does), how many
(`SLURM_NNODES`), which one this is (`SLURM_NODEID`) and the job (`SLURM_JOB_ID`). The first
node hosts the c10d store, at a port derived from the job id (every node computes the same
one, and two jobs sharing a node seldom collide); a requeued job (`SLURM_RESTART_COUNT`)
meets under a run id of its own.

`--signal=B:USR1@<lead>` asks Slurm to warn the batch shell that long before the job's time
limit; the shell (jobs.backends.slurm's script) runs `python -m engine.runtime.slurm --job ID
--bus URL`, which asks for a cold pause (`TIME_LIMIT_COMMAND`) on the job's control channel,
so the ranks checkpoint at the next step boundary and stop (the platform submits it again
from there). Only the shell is signalled: every other process of the step keeps running.
Where Slurm cannot be asked for that warning (a job submitted through slurmrestd), the
platform runs the same command itself when the job's end time is that near.
"""

from __future__ import annotations

import argparse
import re
import socket
from collections.abc import Mapping
from pathlib import Path

from engine.contract import TIME_LIMIT_COMMAND
from engine.runtime import control
from engine.runtime.rendezvous import Rendezvous

PORT_BASE = 20000
PORT_SPAN = 20000


class SlurmEnvironmentError(ValueError):
    """The launcher was asked for Slurm's rendezvous outside an allocation."""


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list as names, in order: `a[1-3,7],b-x[01-02]` ->
    a1 a2 a3 a7 b-x01 b-x02 (ranges keep their zero padding)."""
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)(?:\[([^\]]*)\])?|(,)", text):
        if plain or not prefix:
            continue
        if not ranges:
            names.append(prefix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise SlurmEnvironmentError(f"SLURM_JOB_NODELIST: cannot read {text!r}")
            names += [f"{prefix}{n:0{len(low)}d}" for n in range(int(low), int(high or low) + 1)]
    return names


def rendezvous(env: Mapping[str, str], configs: dict[str, str] | None = None) -> Rendezvous:
    """The rendezvous of this node's launcher in the allocation `env` describes."""
    try:
        nodes = expand_nodelist(env.get("SLURM_JOB_NODELIST") or env["SLURM_NODELIST"])
        count, node, job = int(env["SLURM_NNODES"]), int(env["SLURM_NODEID"]), env["SLURM_JOB_ID"]
    except KeyError as missing:
        raise SlurmEnvironmentError(f"--rendezvous slurm: {missing.args[0]} is not set (run "
                                    "the launcher under srun, in an allocation)") from None
    if len(nodes) != count or not 0 <= node < count:
        raise SlurmEnvironmentError(f"--rendezvous slurm: SLURM_NNODES={count} and "
                                    f"SLURM_NODEID={node} do not fit the node list {nodes}")
    restarts = env.get("SLURM_RESTART_COUNT", "0")
    if count == 1:  # the ranks meet on this node alone, at a free port of its loopback
        return Rendezvous(run_id=f"slurm-{job}-{restarts}", configs=configs or {})
    port = PORT_BASE + int(job) % PORT_SPAN
    return Rendezvous(min_nodes=count, max_nodes=count, endpoint=f"{address(nodes[0])}:{port}",
                      run_id=f"slurm-{job}-{restarts}", local_addr=address(nodes[node]),
                      configs=configs or {}, node_rank=node)


def address(node: str) -> str:
    """The node's address as the other nodes reach it (the name Slurm gives, resolved)."""
    return socket.gethostbyname(node)


def warn(argv: list[str] | None = None) -> int:
    """`python -m engine.runtime.slurm --job ID (--bus URL | --run-dir DIR)`: ask the job's
    ranks for the time limit's pause."""
    parser = argparse.ArgumentParser(prog="python -m engine.runtime.slurm",
                                     description="pause a job before its Slurm time limit")
    parser.add_argument("--job", required=True)
    parser.add_argument("--bus", metavar="REDIS_URL")
    parser.add_argument("--run-dir", type=Path)
    args = parser.parse_args(argv)
    control.send(args.job, "pause", bus_url=args.bus, run_dir=args.run_dir,
                 command_id=TIME_LIMIT_COMMAND)
    return 0


if __name__ == "__main__":
    raise SystemExit(warn())
