"""An emulated multi-node cluster on one Linux host: network namespaces, veth pairs and tc.

    python -m bench.cluster up --nodes 2 --procs-per-node 2 --inter-gbit 1 [--latency-ms 0.05]
    python -m bench.cluster run -- python -m some.module args...
    python -m bench.cluster down

Each node is a namespace `ringside-n<k>`. Local rank j of every node has its own NIC `nic<j>`
(a veth pair, 10.213.<j>.<k+1>/24) plugged into bridge `br<j>` of a switch namespace
`ringside-sw`: one rail per local index, each NIC with its own bandwidth, as on a GPU node
with one NIC per GPU. Both ends of every veth are rate-limited with a tc token bucket (tbf),
so a NIC carries `inter_gbit` in and out at the same time; an added latency, if asked for,
is a netem qdisc under it (half on each end). Ranks on one node talk over the node's local
routes (loopback speed); gloo binds each rank to its NIC (GLOO_SOCKET_IFNAME), so rail
traffic leaves through that rank's own NIC. A rank talking to another rail's rank on another
node goes out through the NIC of the destination's rail (one channel, as a flat ring has).

Everything lives in namespaces this module creates (named after $RINGSIDE_CLUSTER, default
"ringside"); `down` removes them all (after stopping any process still inside) and is safe to
run at any time. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

MASTER_PORT = 29400


def cluster_name() -> str:
    """Namespaces are global to the host: $RINGSIDE_CLUSTER (default "ringside") names this
    cluster, so that two of them (a test and a benchmark, say) can be up side by side."""
    name = os.environ.get("RINGSIDE_CLUSTER", "ringside")
    if not re.fullmatch(r"[a-z][a-z0-9]{0,15}", name):
        raise ValueError(f"RINGSIDE_CLUSTER must be 1-16 lowercase letters/digits, got {name!r}")
    return name


def _switch() -> str:
    return f"{cluster_name()}-sw"


def _state() -> Path:
    return Path(f"/run/{cluster_name()}-cluster.json")


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 2
    procs_per_node: int = 2
    inter_gbit: float = 1.0  # per NIC, each direction
    latency_ms: float = 0.0  # added one-way latency (needs netem); 0 leaves the veth's own
    mtu: int = 9000  # jumbo frames, as on a training fabric

    def __post_init__(self) -> None:
        errors = []
        if self.nodes < 1:
            errors.append(f"nodes must be >= 1, got {self.nodes}")
        if not 1 <= self.procs_per_node <= 250:
            errors.append(f"procs_per_node must be in 1..250, got {self.procs_per_node}")
        if self.nodes > 250:
            errors.append(f"nodes must be <= 250, got {self.nodes}")
        if self.inter_gbit <= 0:
            errors.append(f"inter_gbit must be positive, got {self.inter_gbit}")
        if self.latency_ms < 0:
            errors.append(f"latency_ms must be >= 0, got {self.latency_ms}")
        if not 576 <= self.mtu <= 65535:
            errors.append(f"mtu must be in 576..65535, got {self.mtu}")
        if errors:
            raise ValueError("; ".join(errors))

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def node_ns(node: int) -> str:
    return f"{cluster_name()}-n{node}"


def address(node: int, local: int) -> str:
    """The address of rank (node, local)'s NIC; rail `local` is the subnet 10.213.<local>.0/24."""
    return f"10.213.{local}.{node + 1}"


def _sh(*args: str) -> None:
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"`{' '.join(args)}` failed: {result.stderr.strip()}")


def _shape(ns: str, dev: str, spec: ClusterSpec) -> None:
    rate = spec.inter_gbit * 1e9 / 8  # bytes/s
    # a token bucket of 1 ms at line rate (at least two frames) and a queue of 100 ms, so TCP
    # keeps the link full and never sees drops from the emulation itself
    burst = max(2 * spec.mtu, int(rate / 1000))
    tc = ("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev)
    _sh(
        *tc, "root", "handle", "1:", "tbf", "rate", f"{spec.inter_gbit * 1000:g}mbit",
        "burst", str(burst), "latency", "100ms",
    )  # fmt: skip
    if spec.latency_ms > 0:
        # half the one-way latency on each end of the veth
        delay = f"{round(spec.latency_ms * 500)}us"
        try:
            _sh(*tc, "parent", "1:1", "handle", "10:", "netem", "delay", delay, "limit", "100000")
        except RuntimeError as error:
            raise RuntimeError(
                f"latency_ms: emulating latency needs the kernel's netem qdisc ({error}); "
                "use --latency-ms 0 on this host"
            ) from None


def _sysctl(ns: str, **values: str) -> None:
    for key, value in values.items():
        _sh("ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={value}")


def namespaces() -> list[str]:
    """Our namespaces that exist now."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    prefix = cluster_name() + "-"
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def current() -> ClusterSpec | None:
    """The spec of the cluster that is up, or None."""
    if not _state().exists() or _switch() not in namespaces():
        return None
    return ClusterSpec(**json.loads(_state().read_text()))


def _require_root() -> None:
    if os.geteuid() != 0:
        raise PermissionError("the emulated cluster needs root (network namespaces and tc)")


def up(spec: ClusterSpec) -> ClusterSpec:
    """Create the cluster; a no-op when the same one is up, a rebuild when another one is."""
    _require_root()
    if current() == spec:
        return spec
    down()
    try:
        _create(spec)
    except BaseException:
        down()
        raise
    _state().write_text(json.dumps(asdict(spec)))
    return spec


def _create(spec: ClusterSpec) -> None:
    switch = _switch()
    _sh("ip", "netns", "add", switch)
    _sh("ip", "-n", switch, "link", "set", "lo", "up")
    for local in range(spec.procs_per_node):
        _sh("ip", "-n", switch, "link", "add", f"br{local}", "type", "bridge")
        _sh("ip", "-n", switch, "link", "set", f"br{local}", "mtu", str(spec.mtu), "up")
    for node in range(spec.nodes):
        ns = node_ns(node)
        _sh("ip", "netns", "add", ns)
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        # cross-rail replies come back on another NIC than the request left by: loose
        # reverse-path filtering, and ARP that answers only for the NIC's own address
        _sysctl(
            ns,
            **{
                "net.ipv4.conf.all.rp_filter": "0",
                "net.ipv4.conf.default.rp_filter": "0",
                "net.ipv4.conf.all.arp_ignore": "1",
                "net.ipv4.conf.all.arp_announce": "2",
            },
        )
        for local in range(spec.procs_per_node):
            nic, port = f"nic{local}", f"n{node}r{local}"
            _sh(
                "ip", "link", "add", nic, "netns", ns, "mtu", str(spec.mtu), "type", "veth",
                "peer", "name", port, "netns", switch, "mtu", str(spec.mtu),
            )  # fmt: skip
            _sh("ip", "-n", ns, "addr", "add", f"{address(node, local)}/24", "dev", nic)
            _sh("ip", "-n", ns, "link", "set", nic, "up")
            _sh("ip", "-n", switch, "link", "set", port, "master", f"br{local}", "up")
            _shape(ns, nic, spec)
            _shape(switch, port, spec)


def down() -> None:
    """Stop every process left in our namespaces and delete them; fine to call at any time."""
    for ns in namespaces():
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in pids.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        _sh("ip", "netns", "del", ns)
    _state().unlink(missing_ok=True)


@contextmanager
def cluster(spec: ClusterSpec) -> Iterator[ClusterSpec]:
    """The cluster up for the body, and torn down afterwards whatever happened."""
    try:
        yield up(spec)
    finally:
        down()


def rank_env(spec: ClusterSpec, node: int, local: int, port: int = MASTER_PORT) -> dict[str, str]:
    """The torch.distributed environment of rank (node, local), as torchrun would set it."""
    return {
        "MASTER_ADDR": address(0, 0),
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(spec.world_size),
        "RANK": str(node * spec.procs_per_node + local),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(spec.procs_per_node),
        "GROUP_RANK": str(node),
        "NODE_RANK": str(node),
        "GLOO_SOCKET_IFNAME": f"nic{local}",
    }


def run(cmd: list[str], timeout: float | None = None, port: int = MASTER_PORT) -> int:
    """Run `cmd` once per rank, each in its node's namespace with its rank environment.
    Returns 0 when every rank succeeded; if one fails or the timeout passes, the others are
    stopped and the first failing exit status (or 124 for the timeout) is returned."""
    spec = current()
    if spec is None:
        raise RuntimeError("no emulated cluster is up: run `python -m bench.cluster up` first")
    if not cmd:
        raise ValueError("cmd: give the command to run on every rank")
    procs = []
    for node in range(spec.nodes):
        for local in range(spec.procs_per_node):
            env = {**os.environ, **rank_env(spec, node, local, port)}
            procs.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", node_ns(node), *cmd], env=env, start_new_session=True
                )
            )
    deadline = None if timeout is None else time.monotonic() + timeout
    status = 0
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [code for code in codes if code not in (None, 0)]
            if failed or None not in codes:
                status = failed[0] if failed else 0
                break
            if deadline is not None and time.monotonic() > deadline:
                status = 124
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up", help="create the cluster (idempotent)")
    start.add_argument("--nodes", type=int, default=ClusterSpec.nodes)
    start.add_argument("--procs-per-node", type=int, default=ClusterSpec.procs_per_node)
    start.add_argument("--inter-gbit", type=float, default=ClusterSpec.inter_gbit)
    start.add_argument("--latency-ms", type=float, default=ClusterSpec.latency_ms)
    start.add_argument("--mtu", type=int, default=ClusterSpec.mtu)
    sub.add_parser("down", help="remove the cluster (idempotent)")
    sub.add_parser("status", help="print the cluster that is up, as JSON")
    launch = sub.add_parser("run", help="run CMD on every rank: run [--timeout S] -- CMD")
    launch.add_argument("--timeout", type=float, default=None)
    launch.add_argument("--port", type=int, default=MASTER_PORT)
    launch.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            spec = up(
                ClusterSpec(
                    args.nodes, args.procs_per_node, args.inter_gbit, args.latency_ms, args.mtu
                )
            )
            print(json.dumps(asdict(spec)))
        elif args.command == "down":
            down()
        elif args.command == "status":
            spec = current()
            print(json.dumps(asdict(spec) if spec else None))
        else:
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            return run(cmd, args.timeout, args.port)
    except (ValueError, RuntimeError, PermissionError) as error:
        print(f"bench.cluster: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
