"""The browser tests run against the platform's real services (see tests/platform/conftest.py)
and Debian's Chromium driven by Playwright."""

import os
import shutil
from pathlib import Path

import pytest
from django.db import connections

from tests.platform.conftest import (  # noqa: F401 (fixtures)
    _platform_settings,
    celery_worker,
    eventually,
    live_server_url,
    platform_redis_url,
    service_env,
    user,
)

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
RESULTS = Path(__file__).resolve().parents[2] / "test-results"


def chromium_path() -> str | None:
    for candidate in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser",
                      shutil.which("chromium")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


@pytest.fixture(scope="module")
def browser():
    """Chromium for one test module. Module scope: Playwright's sync API keeps an event loop
    running in this thread while it is open, which later async tests must not inherit."""
    from playwright.sync_api import sync_playwright

    # the tests' own database calls (fixtures) are synchronous and safe, as Playwright's
    # documentation for Django notes; allowed only while the browser is open
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            executable = chromium_path()  # else Playwright's own (`playwright install`)
            browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
            # connections opened while Playwright's loop ran are context-local: close them
            # here, or the test database cannot be dropped at the end of the session
            connections.close_all()
    finally:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture
def page(browser, request):
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def output_dir(request) -> Path:
    """test-results/<test name>/: screenshots and other artifacts of one test."""
    folder = RESULTS / request.node.name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
