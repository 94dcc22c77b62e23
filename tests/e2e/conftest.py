"""The browser tests run against the platform's real services (see tests/platform/conftest.py)
and Debian's Chromium driven by Playwright."""

import os
import shutil
from pathlib import Path

import pytest

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
# Playwright's sync API keeps an event loop running in this thread; the test's own database
# calls (fixtures) are synchronous and safe, as Playwright's docs for Django note.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
RESULTS = Path(__file__).resolve().parents[2] / "test-results"


def chromium_path() -> str | None:
    for candidate in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser",
                      shutil.which("chromium")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        executable = chromium_path()  # else Playwright's own download (`playwright install`)
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


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
