"""Every platform test runs against the session's real services (tests/platform/services.py)."""

import pytest


@pytest.fixture(autouse=True)
def _services(_platform_settings):
    """This process's settings, channel layer and Celery producer on the test services."""
