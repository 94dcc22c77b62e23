"""Real services for the platform and browser tests: Redis, the test database, a Celery worker
and an ASGI server, the last two as subprocesses pointed at the same test database and Redis DB.

The fixtures are registered once, by tests/conftest.py, and switched on by the conftest of
tests/platform and tests/e2e: a second registration (a conftest importing them) would make a
second session instance that points this process's settings elsewhere mid-session.

Redis: the suite's `redis_url` (REDIS_URL in CI, else an embedded redis-server) on a database
number of its own, flushed before and after the session. Database: PostgreSQL when
DATABASE_URL is set, else a SQLite file (var/test_ringside.sqlite3) the subprocesses can open.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.test.utils import override_settings

from common.services import (
    REPO_ROOT,
    child_env,
    stop_process_group,
    wait_for_port,
    web_processes,
    web_server_command,
)
from engine.checkpoint.layout import MANIFEST
from engine.ports import free_port
from tests.workers import worker_index

PLATFORM_REDIS_DB = 14  # each test process its own: 14, 13 (tests/workers.py)
SMALL_SPEC = {"name": "t", "model": {"preset": "nano"},
              "train": {"steps": 6, "micro_batch": 2, "seq_len": 32, "eval_every": 0,
                        "threads": 1},
              "checkpoint": {"every": 0}}


def with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


@pytest.fixture(scope="session")
def platform_redis_url(redis_url: str) -> str:
    url = with_db(redis_url, PLATFORM_REDIS_DB - worker_index())
    client = redis.Redis.from_url(url)
    client.flushdb()  # job ids restart with each test database; so must their streams
    yield url
    client.flushdb()
    client.close()


class FewRoundsPBKDF2(PBKDF2PasswordHasher):
    """The site's own hasher at few iterations. A hash names its iterations, so the test
    services (the web server logs the users in) verify it with their default hasher."""

    iterations = 1_000


@pytest.fixture(scope="session")
def _platform_settings(platform_redis_url, tmp_path_factory, django_db_blocker):
    """Point this process's settings, channel layer and Celery producer at the test services."""
    from django.conf import settings

    from ringside.celery import app

    # a test's users are hashed at few rounds: the site's 1M cost 0.4 s of CPU a user
    override_settings(PASSWORD_HASHERS=[f"{__name__}.{FewRoundsPBKDF2.__name__}"]).enable()
    runs = tmp_path_factory.mktemp("runs")
    uploads = tmp_path_factory.mktemp("uploads")
    # A queue of our own: no other worker on this Redis (another session's) takes our tasks.
    queue = f"ringside-test-{os.getpid()}-{runs.name}"
    # connections opened by websocket consumers' threads close after use, so the test
    # database can be dropped at the end of the session
    settings.DATABASES["default"]["CONN_MAX_AGE"] = 0
    settings.REDIS_URL = platform_redis_url
    settings.RUNS_DIR = runs
    settings.UPLOADS_DIR = uploads
    layer = settings.CHANNEL_LAYERS["default"]["CONFIG"]
    layer["hosts"] = [{**layer["hosts"][0], "address": platform_redis_url}]
    # the app reads Django's CELERY_* settings (namespace "CELERY"); a prefixed key outranks
    # the plain one (`broker_url`), so the override must use the prefixed name
    app.conf.CELERY_BROKER_URL = platform_redis_url
    app.conf.CELERY_TASK_DEFAULT_QUEUE = queue
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield {"redis_url": platform_redis_url, "runs": runs, "queue": queue, "uploads": uploads}


# This process's PostgreSQL sessions look for a deadlock only after this long; the services'
# (worker, web server) after PostgreSQL's default second. A transactional test's flush
# (TRUNCATE of every table, locked one after another) can deadlock with a query a service
# still runs for the test just ended (a scheduling pass it asked for); the session that
# waited longest finds the deadlock and is the one aborted, which was the flush (its test
# then errored, and the next one found the last one's rows). Now it is the service's query.
FLUSH_DEADLOCK_TIMEOUT = "5s"


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix) -> None:
    """pytest-django's hook on the test database's settings: this process's sessions are
    never a deadlock's victim while a service's can be (setting deadlock_timeout needs a
    superuser, or PostgreSQL 15's GRANT SET ON PARAMETER)."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] == "django.db.backends.postgresql":
        database.setdefault("OPTIONS", {})["options"] = (
            f"-c deadlock_timeout={FLUSH_DEADLOCK_TIMEOUT}")


def _database_url(settings_dict: dict) -> str:
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    user = settings_dict.get("USER") or ""
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    return f"postgresql://{user}{password}@{host}{port}/{settings_dict['NAME']}"


@pytest.fixture(scope="session")
def service_env(_platform_settings, django_db_setup, django_db_blocker) -> dict[str, str]:
    """The environment of a platform subprocess that shares this session's test services."""
    from django.db import connection

    return child_env(
        DATABASE_URL=_database_url(connection.settings_dict),
        REDIS_URL=_platform_settings["redis_url"],
        RUNS_DIR=str(_platform_settings["runs"]),
        RINGSIDE_UPLOADS_DIR=str(_platform_settings["uploads"]),
        CELERY_QUEUE=_platform_settings["queue"],
        WORKER_CONCURRENCY="2",
        JOB_CANCEL_GRACE_S="3",
        # a dataset's prepare in shards of 256 KiB: a test's corpus of a few MB has several,
        # and a prepare killed between them resumes (tests/platform/datasets)
        RINGSIDE_DATASET_SHARD_BYTES=str(256 << 10),
        LOG_LEVEL="WARNING",
    )


# the session worker's host, listed once a test started it
WORKER_HOST = f"test-{os.getpid()}"
WORKER_STARTED: list[str] = []


def _session_worker_hosts() -> Any:
    """The session worker's host rows (none if no test started it). A transactional test's
    flush removes its row, which its next beat (within a second) puts back: waited for, so
    that a fixture acting on the rows does not miss one inserted a moment later."""
    from hosts.models import Host

    for name in WORKER_STARTED:
        deadline = time.monotonic() + 3
        while not Host.objects.filter(name=name).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    return Host.objects.filter(name__in=WORKER_STARTED)


@pytest.fixture
def session_worker_host_hidden():
    """For a test in a transaction of its own that counts hosts (its own): the session
    worker's host deleted in the test's transaction, which is rolled back after it (the
    worker's beat meanwhile waits on the row)."""
    _session_worker_hosts().delete()


@pytest.fixture
def session_worker_host_drained(eventually):
    """For a test that makes hosts of its own: the session worker's host drained, so that
    placement sees only the test's hosts."""
    _session_worker_hosts().update(drained=True)


def worker_process(env: dict[str, str], log: Path) -> subprocess.Popen:
    """`manage.py worker` in a session of its own, its output in `log` (its `log_path`)."""
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "manage.py"), "worker"],
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    proc.log_path = log
    return proc


@pytest.fixture(scope="session")
def celery_worker(service_env: dict[str, str], tmp_path_factory) -> subprocess.Popen:
    """A real worker host (`manage.py worker`: registers host `test-<pid>`, beats it, and runs
    a prefork Celery worker of 2 processes) on the session's queue and the host's own."""
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    # a beat a second: a transactional test's flush deletes the host's row, and its next beat
    # registers it again (hosts.registry.beat), before the next test places a job
    # the tests' webhook receivers listen on loopback, which the operator must allow
    env = {**service_env, "RINGSIDE_HOST_NAME": WORKER_HOST, "HOST_BEAT_S": "1",
           "RINGSIDE_WEBHOOK_ALLOW": "127.0.0.0/8"}
    WORKER_STARTED.append(WORKER_HOST)
    proc = worker_process(env, log)
    yield proc
    stop_process_group(proc, grace_s=15)
    if proc.returncode not in (0, -signal.SIGTERM):
        sys.stderr.write(log.read_text(errors="replace")[-4000:])


@pytest.fixture(scope="session")
def live_server_url(service_env: dict[str, str], tmp_path_factory) -> str:
    """The real ASGI server as `serve` runs it, on a free port: HTTP, static files and
    websockets."""
    port = free_port()
    log = tmp_path_factory.mktemp("web") / "web.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            web_server_command("127.0.0.1", port, web_processes()),
            env=service_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, 60, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process_group(proc, grace_s=15)


@pytest.fixture
def small_spec() -> dict:
    """A job that trains for a few seconds on one CPU rank."""
    import copy

    return copy.deepcopy(SMALL_SPEC)


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("ada", password="pw-ada-123")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user("bob", password="pw-bob-123")


@pytest.fixture
def api(user):
    """A DRF client authenticated with `user`'s API token."""
    from rest_framework.test import APIClient

    from jobs.models import ApiToken

    client = APIClient()
    token = ApiToken.objects.create(user=user, name="test")
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def eventually():
    """`eventually(predicate, timeout, message)`: poll until true, else fail with the message."""
    return _eventually


def _eventually(predicate, timeout: float, message: str | Callable[[], str] = "",
                interval: float = 0.2) -> None:
    """`message` may be a function: what it says is read when the wait has failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s: "
                         f"{message() if callable(message) else message}")



def stored_checkpoint(folder: Path) -> str:
    """A checkpoint folder as the platform finds a stored one (its manifest is there; what the
    manifest says is not read here); returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).write_text("{}")
    return str(folder)
