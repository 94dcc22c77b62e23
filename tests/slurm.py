"""A real Slurm cluster (bench.slurm_cluster) as a pytest fixture: `slurm_cluster(n)` brings up
n emulated hosts (network namespaces, bench.cluster's hosts mode, forwarding `forward` ports
of the root namespace's loopback to their gateways) with a controller in the root namespace
and a `slurmd` in each; gone after the test. Skipped, saying why, where Slurm is not installed
or the tests are not root."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from bench import cluster
from bench.cluster import HostsSpec
from bench.slurm_cluster import SlurmCluster, missing

SUBNET = 231  # 10.231.0.0/16: apart from the hosts cluster's (tests/platform/cluster.py)


@pytest.fixture
def slurm_cluster(monkeypatch):
    why = missing()
    if why:
        pytest.skip(why)
    monkeypatch.setenv("RINGSIDE_CLUSTER", "rsslurm")
    made: list[SlurmCluster] = []

    def make(n: int = 2, forward: tuple[int, ...] = ()) -> SlurmCluster:
        spec = cluster.up_hosts(HostsSpec(n, 1.0, SUBNET, tuple(forward)))
        # slurmd's sockets live in its spool folder, their paths under 108 bytes: a short one
        made.append(SlurmCluster(spec, Path(tempfile.mkdtemp(prefix="rs-slurm-"))))
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
