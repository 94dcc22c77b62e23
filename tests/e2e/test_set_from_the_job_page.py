"""A person changes the learning rate of a running job from its page: the Set panel sends it,
the engine's answer appears under Commands with the old and new values, the loss chart gets
the action's marker, and the spec card shows the effective value and its history."""

import re

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.session import open_running_job
from tests.policies import paced

pytestmark = pytest.mark.django_db(transaction=True)


def test_set_the_learning_rate_of_a_running_job_from_its_page(
        page: Page, live_server_url, celery_worker, user, output_dir):
    open_running_job(page, live_server_url, user, "set-e2e", steps=2000, faults=paced(2))

    page.click("#set")
    page.locator("#set-key").select_option("train.lr")
    page.fill("#set-value", "oops")
    page.click("#set-go")  # refused by the API, naming the field
    expect(page.locator("#results li[data-kind=set]").first).to_contain_text(
        "Set refused: train.lr: must be a number")
    page.fill("#set-value", "0.0005")
    page.click("#set-go")
    done = page.locator("#results li[data-kind=set][data-state=done]")
    expect(done).to_contain_text(re.compile(r"Set done at step \d+: train\.lr 0\.002 → 0\.0005"),
                                 timeout=60_000)
    page.wait_for_function(
        """() => (document.getElementById('chart-loss').data || [])
             .some(t => t.name === 'actions' && t.text.some(s => s.includes('train.lr')))""",
        timeout=30_000)
    expect(page.locator("#live-settings tr[data-key='train.lr']")).to_contain_text("0.0005")
    expect(page.locator("#settings-history")).to_contain_text("ada: train.lr 0.002 → 0.0005")
    page.screenshot(path=output_dir / "set-done.png", full_page=True)

    page.click("#cancel")
    expect(page.locator("#state")).to_have_text("cancelled", timeout=60_000)
