"""Fixtures of the jobs tests."""

from __future__ import annotations

from ipaddress import ip_network

import pytest

from jobs.models import Job
from tests.platform.jobs.receiver import Receiver


@pytest.fixture
def running(user, small_spec) -> Job:
    """A job its supervisor reported running (no engine behind it)."""
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    job.start(supervisor="test")
    job.mark_running()
    return job


@pytest.fixture
def loopback_allowed(settings):
    """The operator allows loopback receivers (RINGSIDE_WEBHOOK_ALLOW): the tests' own listen
    there."""
    settings.RINGSIDE_WEBHOOK_ALLOW = (ip_network("127.0.0.0/8"),)


@pytest.fixture
def celery_eager():
    """Celery tasks queued by this process run in it at once, their retries too (without the
    countdown): Celery's own eager mode."""
    from ringside.celery import app

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.fixture
def receiver(loopback_allowed):
    """A receiver on loopback, which the operator allowed."""
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def broker_down():
    """This process's Celery producer pointed at a port nothing listens on, as when Redis is
    down; yields a function that brings the broker back."""
    from engine.ports import free_port
    from ringside.celery import app

    working = app.conf.CELERY_BROKER_URL

    def point_at(url: str) -> None:
        app.conf.CELERY_BROKER_URL = url
        # drop the connection and producer pools, which hold connections to the old URL (as
        # app.close() would; it also unregisters the app, and a shared task imported after
        # that was never registered on it: `jobs.tasks.reap` was NotRegistered)
        app._pool = None
        app.amqp._producer_pool = None

    point_at(f"redis://127.0.0.1:{free_port()}/0")
    yield lambda: point_at(working)
    point_at(working)
