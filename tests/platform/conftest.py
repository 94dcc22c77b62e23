"""Every platform test runs against the session's real services (tests/platform/services.py)."""

import shutil

import pytest
from channels.layers import channel_layers
from django.conf import settings

from tests.platform.cluster import host_cluster  # noqa: F401 (a fixture for every platform test)


@pytest.fixture(autouse=True)
def _services(_platform_settings):
    """This process's settings, channel layer and Celery producer on the test services; a
    channel layer of its own for each test. Each async test runs in an event loop of its own,
    and a Redis channel layer that a consumer of an earlier test's loop still receives on keeps
    that loop's receive lock: the next loop to receive on it failed ("bound to a different
    event loop")."""
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def _fresh_uploads(_services):
    """Each test's uploaded files its own: user ids come back after a test's rollback."""
    yield
    shutil.rmtree(settings.UPLOADS_DIR, ignore_errors=True)
    settings.UPLOADS_DIR.mkdir()
