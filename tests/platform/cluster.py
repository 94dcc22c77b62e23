"""The one-machine cluster of worker hosts (bench.host_cluster) as a pytest fixture.

`host_cluster(n, forward=(), inter_gbit=1.0, **env)` brings up n host namespaces `<cluster>-h<k>`
(cluster name from $RINGSIDE_CLUSTER, default "rshosts") and starts a real `manage.py worker`
in each, on the session's test database and Redis. The cluster, its workers and everything
they started are gone after the test. Needs root (the test is skipped, saying so, elsewhere).
"""

from __future__ import annotations

import os
import shutil

import pytest

from bench import cluster
from bench import host_cluster as hosts_mode
from bench.host_cluster import HostCluster

NEEDS_ROOT = ("the cluster of hosts needs root and iproute2 (ip, tc) to create network "
              "namespaces")


def skip_unless_root() -> None:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip(NEEDS_ROOT)


@pytest.fixture
def host_cluster(service_env, tmp_path, monkeypatch):
    """host_cluster(n, forward=(), inter_gbit=1.0, **env) -> HostCluster, its n workers
    started (not yet registered: wait for their Host rows)."""
    skip_unless_root()
    if not os.environ.get("RINGSIDE_CLUSTER"):
        monkeypatch.setenv("RINGSIDE_CLUSTER", "rshosts")
    made: list[HostCluster] = []

    def make(n: int, forward: tuple[int, ...] = (), inter_gbit: float = 1.0,
             **env: str) -> HostCluster:
        made.append(hosts_mode.up(n, service_env, tmp_path, forward, inter_gbit, **env))
        return made[-1]

    yield make
    for hosts in made:
        for k in range(len(hosts.hosts)):
            hosts.kill(k)
    cluster.down()
