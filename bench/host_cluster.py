"""A cluster of worker hosts on this one machine, for tests and benchmarks: bench.cluster's
hosts mode (a network namespace per host, a rate-limited link to the root namespace) with a
real `manage.py worker` in each, named `<cluster>-h<k>`, at its own address, on the services
(PostgreSQL, Redis) of the root namespace reached through its gateway (bench.cluster forwards
their loopback ports, and any `forward=` ports). Needs root.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil

from bench import cluster
from bench.cluster import HostsSpec
from common.services import REPO_ROOT

SUBNETS = range(214, 254)  # the first one no interface of this machine uses


@dataclass
class ClusterHost:
    index: int
    name: str  # its RINGSIDE_HOST_NAME
    address: str  # its RINGSIDE_HOST_ADDRESS
    gateway: str  # the root namespace (services) as it reaches it
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen | None = None

    @property
    def namespace(self) -> str:
        return cluster.host_ns(self.index)


def _via(url: str, host: str) -> str:
    """`url` with its host replaced (the port and the rest kept)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")
    auth = netloc[0] + "@" if netloc[1] else ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{auth}{host}{port}"))


class HostCluster:
    def __init__(self, spec: HostsSpec, service_env: dict[str, str], logs: Path,
                 env: dict[str, str]):
        self.spec = spec
        self._made_with = (service_env, logs, env)
        self.hosts = [self._host(k, *self._made_with) for k in range(spec.hosts)]

    def grow(self, count: int) -> list[ClusterHost]:
        """`count` more hosts join, each starting its worker (as the first ones did)."""
        self.spec = cluster.add_hosts(count)
        added = [self._host(k, *self._made_with)
                 for k in range(len(self.hosts), self.spec.hosts)]
        self.hosts += added
        return [self.start(host.index) for host in added]

    def _host(self, k: int, service_env: dict[str, str], logs: Path,
              env: dict[str, str]) -> ClusterHost:
        name = f"{cluster.cluster_name()}-h{k}"
        gateway = self.spec.gateway(k)
        # every namespace shares the machine's hostname, which resolves to no host's address:
        # gloo (the engine's ranks inherit this environment) binds to the host's own NIC
        environ = {**service_env, "RINGSIDE_HOST_NAME": name, "GLOO_SOCKET_IFNAME": "eth0",
                   "RINGSIDE_HOST_ADDRESS": self.spec.address(k),
                   "REDIS_URL": _via(service_env["REDIS_URL"], gateway), **env}
        if environ["DATABASE_URL"].startswith("postgres"):
            environ["DATABASE_URL"] = _via(environ["DATABASE_URL"], gateway)
        return ClusterHost(k, name, self.spec.address(k), gateway, environ,
                           logs / f"{name}.log")

    def start(self, k: int) -> ClusterHost:
        """Start host k's worker (again, after `kill`)."""
        host = self.hosts[k]
        with host.log.open("ab") as out:
            host.proc = subprocess.Popen(
                cluster.host_command(k, [sys.executable, str(REPO_ROOT / "manage.py"),
                                         "worker"]),
                env=host.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return host

    def kill(self, k: int) -> None:
        """Host k's worker and everything it started (its training ranks too) die at once,
        as when the machine goes."""
        proc = self.hosts[k].proc
        if proc is None or proc.poll() is not None:
            return
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        os.killpg(proc.pid, signal.SIGKILL)
        for child in tree:  # those in sessions of their own
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait(10)

    def cut(self, k: int) -> None:
        """Host k's link down: its worker runs on, unreachable and reaching nothing."""
        cluster.cut(k)

    def restore(self, k: int) -> None:
        cluster.restore(k)

    def log_tail(self, k: int, chars: int = 3000) -> str:
        path = self.hosts[k].log
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _up(n: int, forward: tuple[int, ...], inter_gbit: float) -> HostsSpec:
    for subnet in SUBNETS:
        try:
            return cluster.up_hosts(HostsSpec(n, inter_gbit, subnet, forward))
        except ValueError as error:
            if not str(error).startswith("subnet:"):
                raise
    raise RuntimeError("no free 10.x.0.0/16 subnet for the cluster of hosts")


def _service_ports(service_env: dict[str, str]) -> tuple[int, ...]:
    ports = [urlsplit(service_env["REDIS_URL"]).port or 6379]
    if service_env["DATABASE_URL"].startswith("postgres"):
        ports.append(urlsplit(service_env["DATABASE_URL"]).port or 5432)
    return tuple(ports)


def up(n: int, service_env: dict[str, str], logs: Path, forward: tuple[int, ...] = (),
       inter_gbit: float = 1.0, **env: str) -> HostCluster:
    """n host namespaces, each with its worker started (not yet registered: wait for their
    Host rows); `env` is added to every worker's environment. `cluster.down()` ends it."""
    spec = _up(n, _service_ports(service_env) + tuple(forward), inter_gbit)
    hosts = HostCluster(spec, service_env, logs, env)
    for k in range(n):
        hosts.start(k)
    return hosts
