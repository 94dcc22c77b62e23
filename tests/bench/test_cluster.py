"""The emulated cluster: namespaces and shaped NICs come up, ranks run a real collective
across them, and everything is gone afterwards, even when a rank fails. Needs root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench import cluster
from bench.cluster import ClusterSpec

ROOT = Path(__file__).resolve().parents[2]

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"),
    reason="the emulated cluster needs root and iproute2 (ip, tc) to create network namespaces",
)

# every rank checks it sits on its own NIC in its node's namespace, then all-reduces its
# rank + 1 with each algorithm; 2x2 ranks must all see 1 + 2 + 3 + 4
RANK = textwrap.dedent(
    f"""
    import os, sys, torch, torch.distributed as dist
    sys.path.insert(0, {str(ROOT)!r})
    from bench.cluster import address
    from engine.horing import ALGOS, Topology, all_reduce
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    node = rank // int(os.environ["LOCAL_WORLD_SIZE"])
    nic = os.environ["GLOO_SOCKET_IFNAME"]
    assert address(node, local) in os.popen(f"ip -4 addr show {{nic}}").read()
    dist.init_process_group("gloo")
    topo = Topology.from_env().init_groups()
    for algo in ALGOS:
        x = torch.full((1001,), float(rank + 1))
        all_reduce(x, topo, algo=algo)
        assert torch.equal(x, torch.full((1001,), 10.0)), (algo, x[:4])
    dist.destroy_process_group()
    """
)


@pytest.fixture(autouse=True)
def own_cluster_name(monkeypatch):
    """Namespaces are global to the host: keep clear of a benchmark's cluster."""
    monkeypatch.setenv("RINGSIDE_CLUSTER", "rstest")


def test_spec_rejects_bad_values_by_name():
    with pytest.raises(ValueError, match="nodes must be >= 1.*inter_gbit must be positive"):
        ClusterSpec(nodes=0, inter_gbit=0)
    with pytest.raises(ValueError, match="mtu must be in"):
        ClusterSpec(mtu=100)


def test_cluster_names_are_checked(monkeypatch):
    monkeypatch.setenv("RINGSIDE_CLUSTER", "Bad Name")
    with pytest.raises(ValueError, match="RINGSIDE_CLUSTER must be"):
        cluster.namespaces()


@needs_root
def test_a_2x2_cluster_runs_a_collective_and_tears_down_cleanly():
    spec = ClusterSpec(nodes=2, procs_per_node=2, inter_gbit=1.0)
    try:
        assert cluster.up(spec) == spec
        assert cluster.up(spec) == spec  # idempotent: already up
        assert sorted(cluster.namespaces()) == ["rstest-n0", "rstest-n1", "rstest-sw"]
        qdisc = subprocess.run(
            ["ip", "netns", "exec", "rstest-n1", "tc", "qdisc", "show", "dev", "nic1"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "tbf" in qdisc and "rate 1Gbit" in qdisc
        assert cluster.run([sys.executable, "-c", RANK], timeout=120) == 0
    finally:
        cluster.down()
    assert cluster.namespaces() == []
    assert cluster.current() is None
    cluster.down()  # idempotent: nothing left to remove


@needs_root
def test_a_failing_rank_stops_the_others_and_teardown_leaves_nothing():
    with cluster.cluster(ClusterSpec(nodes=2, procs_per_node=1)):
        start = time.monotonic()
        fail_on_rank_1 = (
            "import os, sys, time; int(os.environ['RANK']) == 1 and sys.exit(3); time.sleep(60)"
        )
        assert cluster.run([sys.executable, "-c", fail_on_rank_1], timeout=60) == 3
        assert time.monotonic() - start < 30
        for ns in cluster.namespaces():
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            assert pids.stdout.split() == [], ns
    assert cluster.namespaces() == []


def test_run_without_a_cluster_says_so():
    with pytest.raises(RuntimeError, match="no emulated cluster is up"):
        cluster.run(["true"])


# -- hosts mode ------------------------------------------------------------------------------

SERVE_ONCE = ("import socket, sys; s = socket.create_server((sys.argv[1], 7777)); "
              "c, peer = s.accept(); c.sendall(peer[0].encode()); c.close()")
ASK = ("import socket, sys; print(socket.create_connection((sys.argv[1], int(sys.argv[2])), "
       "timeout=3).recv(100).decode())")


# the name of the address in argv[1], then the resolver's configuration
NAME_OF = ("import socket, sys; print(socket.getnameinfo((sys.argv[1], 0), socket.NI_NAMEREQD)[0]);"
           " print(open('/etc/resolv.conf').read())")


def in_host(host: int, code: str, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(cluster.host_command(host, [sys.executable, "-c", code, *args]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_hosts_spec_rejects_bad_values_by_name():
    with pytest.raises(ValueError, match="hosts must be in 1..250.*subnet must be in"):
        cluster.HostsSpec(hosts=0, subnet=3)
    with pytest.raises(ValueError, match="forward: ports must be in"):
        cluster.HostsSpec(forward=(0,))


@needs_root
def test_hosts_reach_each_other_and_the_roots_loopback_services_through_the_root_namespace():
    forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    service = subprocess.Popen([sys.executable, "-c", SERVE_ONCE, "127.0.0.1"])
    spec = cluster.HostsSpec(hosts=2, inter_gbit=0.5, subnet=251, forward=(7777,))
    try:
        assert cluster.up_hosts(spec) == spec and cluster.current_hosts() == spec
        qdisc = subprocess.run(["tc", "qdisc", "show", "dev", "rstest-h1"], capture_output=True,
                               text=True, check=True).stdout
        assert "tbf" in qdisc and "rate 500Mbit" in qdisc
        # a service on the root's 127.0.0.1, reached at the host's gateway (the forwarder)
        ask = in_host(1, ASK, spec.gateway(1), "7777")
        assert ask.communicate(timeout=30)[0].strip() == "127.0.0.1", ask.stderr
        # host 0 to host 1, through the root namespace, from host 0's own address
        server = in_host(1, SERVE_ONCE, spec.address(1))
        time.sleep(1.0)
        ask = in_host(0, ASK, spec.address(1), "7777")
        assert ask.communicate(timeout=30)[0].strip() == spec.address(0)
        server.wait(10)
        # a cut link reaches nothing; restored, it does again
        cluster.cut(0)
        ask = in_host(0, ASK, spec.gateway(0), "7777")
        assert ask.wait(30) != 0
        cluster.restore(0)
        server = in_host(1, SERVE_ONCE, spec.address(1))
        time.sleep(1.0)
        assert in_host(0, ASK, spec.address(1), "7777").communicate(timeout=30)[0].strip()
        server.wait(10)
        # names: a peer's address is named by the cluster's hosts file, and the only DNS
        # server a host asks is its own loopback (the machine's is out of its reach: waiting
        # for it held torch's store seconds a lookup)
        named = in_host(0, NAME_OF, spec.address(1)).communicate(timeout=30)[0].split()
        assert named == [cluster.host_ns(1), "nameserver", "127.0.0.1"]
        # forwarding is on for the hosts' veths only
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forwarding
    finally:
        service.kill()
        cluster.down()
    assert cluster.namespaces() == [] and cluster.current_hosts() is None
    assert not list(Path("/etc/netns").glob("rstest-*"))
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert "rstest-h" not in links
