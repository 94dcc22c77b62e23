"""Free ports for servers a process starts next (the engine's rendezvous, the platform's
services, tests and benchmarks): one helper for all of them."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's choice), for a server started next."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
