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

Hosts mode (`up-hosts`, the one-machine cluster of worker hosts, issue 21): each host is a
namespace `<cluster>-h<k>` with one veth `eth0` (10.<subnet>.<k>.2/24) whose peer
`<cluster>-h<k>` stays in the ROOT namespace (10.<subnet>.<k>.1/24, the host's gateway), so a
host reaches the root namespace's PostgreSQL, Redis and web server at its gateway address, and
the other hosts through the root namespace (forwarding is switched on for these veths only).
Both ends are rate-limited (tbf, `inter_gbit`). Services on the root's 127.0.0.1 are not
reachable from a namespace at 127.0.0.1: `up-hosts --forward PORT,...` starts a TCP forwarder
in the root namespace listening on every host's gateway address at each PORT, onto
127.0.0.1:PORT, so a host's worker uses the same URLs with its gateway as the host. `cut` takes
a host's link down (root side: it reaches nothing and nothing reaches it), `restore` brings it
back.

    python -m bench.cluster up-hosts --hosts 3 [--inter-gbit 1] [--forward 5432,6379,8000]
    python -m bench.cluster exec-host 1 -- python manage.py worker
    python -m bench.cluster cut 1 ; python -m bench.cluster restore 1

Everything lives in namespaces this module creates (named after $RINGSIDE_CLUSTER, default
"ringside"); `down` removes them all (after stopping any process still inside, and the
forwarder) and is safe to run at any time. Needs root.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import signal
import socket
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


def _hosts_state() -> Path:
    return Path(f"/run/{cluster_name()}-hosts.json")


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


def _name_service(ns: str, names: dict[str, str]) -> None:
    """What `ip netns exec` gives namespace `ns` for /etc/hosts and /etc/resolv.conf: the
    machine's hosts file and the emulated hosts' `names` (address -> name), and no DNS server
    but the namespace's own loopback (none listens: a lookup fails at once). The machine's
    DNS server is out of the namespaces' reach, and torch's store looks up each peer's name:
    each lookup waited for the resolver's timeout, seconds a rank, that real hosts, whose
    names resolve, never wait."""
    folder = Path("/etc/netns") / ns
    folder.mkdir(parents=True, exist_ok=True)
    own = Path("/etc/hosts").read_text()
    listed = "".join(f"{address} {name}\n" for address, name in names.items())
    (folder / "hosts").write_text(f"{own.rstrip()}\n# the emulated cluster\n{listed}")
    (folder / "resolv.conf").write_text("nameserver 127.0.0.1\n")


def _sh(*args: str) -> None:
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"`{' '.join(args)}` failed: {result.stderr.strip()}")


def _shape(ns: str | None, dev: str, spec: ClusterSpec) -> None:
    """Rate-limit (and delay) what `dev` sends; `ns` None: a device of the root namespace."""
    rate = spec.inter_gbit * 1e9 / 8  # bytes/s
    # a token bucket of 1 ms at line rate (at least two frames) and a queue of 100 ms, so TCP
    # keeps the link full and never sees drops from the emulation itself
    burst = max(2 * spec.mtu, int(rate / 1000))
    inside = ("ip", "netns", "exec", ns) if ns else ()
    tc = (*inside, "tc", "qdisc", "replace", "dev", dev)
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
        _name_service(ns, {address(n, local): f"{node_ns(n)}-nic{local}"
                           for n in range(spec.nodes) for local in range(spec.procs_per_node)})
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
        shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
    # a namespace is destroyed later, in the background, and its veths with it: delete the
    # hosts' root-side veths now, so that a cluster made next can take their names at once
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for veth in re.findall(rf"^\d+: ({re.escape(cluster_name())}-h\d+)@", links, re.M):
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
    _state().unlink(missing_ok=True)
    _stop_forwarder()
    _hosts_state().unlink(missing_ok=True)


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


# -- hosts mode: worker hosts that reach the root namespace ----------------------------------


@dataclass(frozen=True)
class HostsSpec:
    hosts: int = 3
    inter_gbit: float = 1.0  # each host's link, each direction
    subnet: int = 214  # host k is 10.<subnet>.<k>.2, its gateway (the root side) 10.<subnet>.<k>.1
    forward: tuple[int, ...] = ()  # root-namespace 127.0.0.1 ports reachable at the gateways
    mtu: int = 1500
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        errors = []
        if not 1 <= self.hosts <= 250:
            errors.append(f"hosts must be in 1..250, got {self.hosts}")
        if self.inter_gbit <= 0:
            errors.append(f"inter_gbit must be positive, got {self.inter_gbit}")
        if not 16 <= self.subnet <= 254:
            errors.append(f"subnet must be in 16..254 (10.<subnet>.0.0/16), got {self.subnet}")
        if any(not 1 <= p <= 65535 for p in self.forward):
            errors.append(f"forward: ports must be in 1..65535, got {list(self.forward)}")
        if errors:
            raise ValueError("; ".join(errors))
        object.__setattr__(self, "forward", tuple(self.forward))

    def address(self, host: int) -> str:
        """Host `host`'s own address (its peers and the platform reach it there)."""
        return f"10.{self.subnet}.{host}.2"

    def gateway(self, host: int) -> str:
        """The root namespace as host `host` reaches it (its services, forwarded ports)."""
        return f"10.{self.subnet}.{host}.1"


def host_ns(host: int) -> str:
    return f"{cluster_name()}-h{host}"


def _root_veth(host: int) -> str:
    name = f"{cluster_name()}-h{host}"
    if len(name) > 15:  # the kernel's limit on interface names
        raise ValueError(f"RINGSIDE_CLUSTER: {cluster_name()!r} is too long for hosts mode "
                         f"(interface {name!r} over 15 characters)")
    return name


def current_hosts() -> HostsSpec | None:
    """The hosts cluster that is up, or None."""
    if not _hosts_state().exists() or host_ns(0) not in namespaces():
        return None
    state = json.loads(_hosts_state().read_text())
    return HostsSpec(**{**state["spec"], "forward": tuple(state["spec"]["forward"])})


def up_hosts(spec: HostsSpec) -> HostsSpec:
    """Create the hosts cluster (and its forwarder); a no-op when the same one is up, else a
    rebuild. Refuses a subnet some interface of the root namespace already uses."""
    _require_root()
    if current_hosts() == spec:
        return spec
    down()
    taken = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True,
                           text=True).stdout
    if f" 10.{spec.subnet}." in taken:
        raise ValueError(f"subnet: 10.{spec.subnet}.0.0/16 is in use by an interface of this "
                         "machine (another cluster?); pick another with --subnet")
    try:
        for host in range(spec.hosts):
            _create_host(spec, host)
        pids = [_start_forwarder(spec, range(spec.hosts))] if spec.forward else []
    except BaseException:
        down()
        raise
    _hosts_state().write_text(json.dumps({"spec": asdict(spec), "forwarders": pids}))
    return spec


def add_hosts(count: int) -> HostsSpec:
    """Add `count` hosts to the hosts cluster that is up (hosts that join later); returns its
    spec now."""
    _require_root()
    spec = current_hosts()
    if spec is None:
        raise RuntimeError("no hosts cluster is up: run `python -m bench.cluster up-hosts`")
    grown = HostsSpec(**{**asdict(spec), "hosts": spec.hosts + count})
    state = json.loads(_hosts_state().read_text())
    added = range(spec.hosts, grown.hosts)
    for host in added:
        _create_host(grown, host)
    if grown.forward:
        state["forwarders"].append(_start_forwarder(grown, added))
    _hosts_state().write_text(json.dumps({"spec": asdict(grown),
                                          "forwarders": state["forwarders"]}))
    return grown


def _create_host(spec: HostsSpec, host: int) -> None:
    ns, veth = host_ns(host), _root_veth(host)
    _sh("ip", "netns", "add", ns)
    _sh("ip", "-n", ns, "link", "set", "lo", "up")
    _name_service(ns, {spec.address(h): host_ns(h) for h in range(max(spec.hosts, host + 1))})
    _sh("ip", "link", "add", veth, "mtu", str(spec.mtu), "type", "veth", "peer", "name", "eth0",
        "netns", ns, "mtu", str(spec.mtu))
    _sh("ip", "addr", "add", f"{spec.gateway(host)}/24", "dev", veth)
    _sh("ip", "-n", ns, "addr", "add", f"{spec.address(host)}/24", "dev", "eth0")
    _sh("ip", "link", "set", veth, "up")
    _sh("ip", "-n", ns, "link", "set", "eth0", "up")
    _sh("ip", "-n", ns, "route", "add", "default", "via", spec.gateway(host))
    # host-to-host traffic crosses the root namespace: forward on these veths only (every
    # other interface keeps its own setting)
    _sh("sysctl", "-qw", f"net.ipv4.conf.{veth}.forwarding=1")
    shape = ClusterSpec(inter_gbit=spec.inter_gbit, mtu=max(spec.mtu, 576),
                        latency_ms=spec.latency_ms)
    _shape(ns, "eth0", shape)
    _shape(None, veth, shape)


def cut(host: int) -> None:
    """Take host `host`'s link down: it reaches nothing outside itself, nothing reaches it."""
    _sh("ip", "link", "set", _root_veth(host), "down")


def restore(host: int) -> None:
    """Bring a cut link back (the kernel restores the gateway's routes with it)."""
    _sh("ip", "link", "set", _root_veth(host), "up")


def host_command(host: int, cmd: list[str]) -> list[str]:
    """`cmd` as run inside host `host`'s namespace."""
    return ["ip", "netns", "exec", host_ns(host), *cmd]


def _start_forwarder(spec: HostsSpec, hosts: range) -> int:
    """A forwarder for the gateways of `hosts`; its pid once it listens."""
    listen = ",".join(spec.gateway(h) for h in hosts)
    ports = ",".join(str(p) for p in spec.forward)
    proc = subprocess.Popen([sys.executable, "-m", "bench.cluster", "forward", "--listen", listen,
                             "--ports", ports], cwd=Path(__file__).resolve().parents[1],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            start_new_session=True)
    ready = proc.stdout.readline()  # one line once every socket listens
    if proc.poll() is not None or not ready.startswith(b"forwarding"):
        proc.kill()
        raise RuntimeError(f"the forwarder did not start (exit {proc.wait()})")
    return proc.pid


def _stop_forwarder() -> None:
    if not _hosts_state().exists():
        return
    for pid in json.loads(_hosts_state().read_text()).get("forwarders", []):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def forward(listen: list[str], ports: list[int]) -> None:
    """Serve until killed: every connection to (address, port) for each listen address and
    port is relayed to 127.0.0.1:port."""
    import asyncio

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    def relay(port: int):
        async def accept(reader, writer) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        return accept

    async def listening(address: str, port: int) -> asyncio.Server | None:
        try:
            return await asyncio.start_server(relay(port), address, port)
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
        # the service listens on every address itself (0.0.0.0): reachable without us
        with socket.create_connection((address, port), timeout=2):
            return None

    async def serve() -> None:
        found = [await listening(address, port) for address in listen for port in ports]
        servers = [server for server in found if server is not None]
        print("forwarding", flush=True)
        await asyncio.gather(*(server.serve_forever() for server in servers))

    asyncio.run(serve())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up", help="create the cluster (idempotent)")
    start.add_argument("--nodes", type=int, default=ClusterSpec.nodes)
    start.add_argument("--procs-per-node", type=int, default=ClusterSpec.procs_per_node)
    start.add_argument("--inter-gbit", type=float, default=ClusterSpec.inter_gbit)
    start.add_argument("--latency-ms", type=float, default=ClusterSpec.latency_ms)
    start.add_argument("--mtu", type=int, default=ClusterSpec.mtu)
    hosts = sub.add_parser("up-hosts", help="create the hosts cluster (idempotent)")
    hosts.add_argument("--hosts", type=int, default=HostsSpec.hosts)
    hosts.add_argument("--inter-gbit", type=float, default=HostsSpec.inter_gbit)
    hosts.add_argument("--subnet", type=int, default=HostsSpec.subnet)
    hosts.add_argument("--forward", type=_ports, default=(), help="PORT,PORT,...")
    sub.add_parser("down", help="remove the cluster (idempotent)")
    sub.add_parser("status", help="print the cluster that is up, as JSON")
    launch = sub.add_parser("run", help="run CMD on every rank: run [--timeout S] -- CMD")
    launch.add_argument("--timeout", type=float, default=None)
    launch.add_argument("--port", type=int, default=MASTER_PORT)
    launch.add_argument("cmd", nargs=argparse.REMAINDER)
    for name, text in (("cut", "take a host's link down"), ("restore", "bring it back")):
        sub.add_parser(name, help=text).add_argument("host", type=int)
    inside = sub.add_parser("exec-host", help="run CMD in a host: exec-host K -- CMD")
    inside.add_argument("host", type=int)
    inside.add_argument("cmd", nargs=argparse.REMAINDER)
    relay = sub.add_parser("forward", help="(internal) the hosts cluster's TCP forwarder")
    relay.add_argument("--listen", required=True)
    relay.add_argument("--ports", type=_ports, required=True)
    return parser


def _ports(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(",") if p.strip())


def _command(cmd: list[str]) -> list[str]:
    return cmd[1:] if cmd[:1] == ["--"] else cmd


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "up":
            spec = up(ClusterSpec(args.nodes, args.procs_per_node, args.inter_gbit,
                                  args.latency_ms, args.mtu))
            print(json.dumps(asdict(spec)))
        elif args.command == "up-hosts":
            print(json.dumps(asdict(up_hosts(HostsSpec(args.hosts, args.inter_gbit,
                                                       args.subnet, args.forward)))))
        elif args.command == "down":
            down()
        elif args.command == "status":
            spec = current() or current_hosts()
            print(json.dumps(asdict(spec) if spec else None))
        elif args.command in ("cut", "restore"):
            (cut if args.command == "cut" else restore)(args.host)
        elif args.command == "exec-host":
            return subprocess.call(host_command(args.host, _command(args.cmd)))
        elif args.command == "forward":
            forward(args.listen.split(","), list(args.ports))
        else:
            return run(_command(args.cmd), args.timeout, args.port)
    except (ValueError, RuntimeError, PermissionError) as error:
        print(f"bench.cluster: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
