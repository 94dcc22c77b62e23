"""Browser sessions for the page tests that are not about logging in."""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.conf import settings
from django.db import connection
from django.test import Client
from playwright.sync_api import Page, expect

from engine.runtime.spec import parse_spec
from jobs.models import Job
from jobs.tasks import dispatch
from tests.policies import OBSERVE_STRAGGLERS

T = TypeVar("T")
ENGINE_START_MS = 120_000  # an engine launch on two busy cores


def log_in(page: Page, live_server_url: str, user) -> None:
    """Give `page`'s browser the session cookie of `user`, logged in through Django's own
    login (a session row in the shared test database), without filling the login form."""
    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME]
    page.context.add_cookies([{"name": cookie.key, "value": cookie.value,
                               "url": live_server_url}])


def open_running_job(page: Page, live_server_url: str, user, name: str, steps: int,
                     faults: dict = OBSERVE_STRAGGLERS, checkpoint_every: int = 0) -> Job:
    """Launch a nano job on 1x2 ranks through the worker, open its page as `user` and wait
    until the page says it runs."""
    spec = parse_spec({"name": name, "model": {"preset": "nano"},
                       "parallel": {"nodes": 1, "procs_per_node": 2},
                       "train": {"steps": steps, "micro_batch": 2, "seq_len": 32,
                                 "eval_every": 0, "threads": 1},
                       "checkpoint": {"every": checkpoint_every}, "faults": faults}).to_dict()
    job = Job.objects.create(name=name, owner=user, spec=spec)
    dispatch(job)
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/jobs/{job.pk}/")
    expect(page.locator("#state")).to_have_text("running", timeout=ENGINE_START_MS)
    return job


def off_the_page_thread(change: Callable[[], T]) -> T:
    """Make a change (a state move, an API call) as the platform's other processes do,
    outside the event loop that Playwright runs in this thread (the change's websocket push
    runs its own); returns what `change` returns."""
    def run() -> T:
        try:
            return change()
        finally:
            connection.close()  # this thread's own database connection
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()
