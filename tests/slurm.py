"""A real Slurm cluster (bench.slurm_cluster) as a pytest fixture: `slurm_cluster(n)` brings up
n emulated hosts (network namespaces, bench.cluster's hosts mode, forwarding `forward` ports
of the root namespace's loopback to their gateways) with a controller in the root namespace
and a `slurmd` in each; gone after the test. Namespaces and addresses are global to the
machine, so each test process names its own and takes a subnet no other uses (two pytest-xdist
workers, or two test runs side by side, would otherwise tear down each other's nodes).
`slurm_cluster(n, rest=True)` also runs slurmrestd (its `rest_url`, root's `token`). Skipped,
saying why, where Slurm (or slurmrestd) is not installed or the tests are not root."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from bench import cluster
from bench.cluster import HostsSpec
from bench.slurm_cluster import SlurmCluster, missing, missing_rest

# 10.N.0.0/16, N among these: apart from the hosts clusters' (tests/platform/cluster.py, bench)
SUBNETS = range(233, 251)


def free_subnet() -> int:
    """A subnet of SUBNETS that no interface of this machine has an address in."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True,
                          check=True).stdout
    return next(n for n in SUBNETS if f" 10.{n}." not in used)


@pytest.fixture
def slurm_cluster(monkeypatch):
    why = missing()
    if why:
        pytest.skip(why)
    monkeypatch.setenv("RINGSIDE_CLUSTER", f"rss{os.getpid() % 100000}")
    made: list[SlurmCluster] = []

    def make(n: int = 2, forward: tuple[int, ...] = (), rest: bool = False) -> SlurmCluster:
        if rest and missing_rest():
            pytest.skip(missing_rest())
        spec = cluster.up_hosts(HostsSpec(n, 1.0, free_subnet(), tuple(forward)))
        # slurmd's sockets live in its spool folder, their paths under 108 bytes: a short one
        made.append(SlurmCluster(spec, Path(tempfile.mkdtemp(prefix="rs-slurm-")), rest=rest))
        made[-1].start()
        for name, value in made[-1].env.items():
            monkeypatch.setenv(name, value)
        return made[-1]

    yield make
    for slurm in made:
        slurm.stop()
    cluster.down()
    for slurm in made:
        shutil.rmtree(slurm.folder, ignore_errors=True)
