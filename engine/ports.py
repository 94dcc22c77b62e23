"""Free ports for servers a process starts next (the engine's rendezvous, the platform's
services, tests and benchmarks): one helper for all of them; and which interface holds an
address (where gloo binds a host's ranks)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's choice), for a server started next."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def interface_of(address: str) -> str:
    """The network interface that holds `address` (the host's registered one): gloo binds the
    ranks there, where the other hosts reach them, rather than where the host name resolves."""
    import psutil  # here, so that engine.contract, which re-exports free_port, stays stdlib-only

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    raise RuntimeError(f"no network interface of this host has the address {address} it "
                       "is reached at")
