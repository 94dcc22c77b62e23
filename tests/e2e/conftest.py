"""The browser tests run against the platform's real services (tests/platform/services.py)
and Debian's Chromium driven by Playwright."""

import os
from pathlib import Path

import pytest
from django.db import connections

from bench.platform_env import CHROMIUM_ARGS, chromium_path

RESULTS = Path(__file__).resolve().parents[2] / "test-results"


@pytest.fixture(autouse=True)
def _services(_platform_settings):
    """This process's settings, channel layer and Celery producer on the test services."""


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
    """A laptop-sized page. Its last view is saved as test-results/<test>/last.png (what a
    failed test was looking at), and an uncaught script error fails the test."""
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    folder = RESULTS / request.node.name
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=folder / "last.png", full_page=True)
    context.close()
    assert not errors, f"uncaught errors in the page's scripts: {errors}"


@pytest.fixture
def output_dir(request) -> Path:
    """test-results/<test name>/: screenshots and other artifacts of one test."""
    folder = RESULTS / request.node.name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
