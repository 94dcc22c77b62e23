"""A person changes the learning rate of a running job from its page: the Set panel sends it,
the engine's answer appears under Commands with the old and new values, the loss chart gets
the action's marker, and the spec card shows the effective value and its history."""

import re

import pytest
from playwright.sync_api import Page, expect

from engine.runtime.spec import parse_spec
from jobs.models import Job
from jobs.tasks import dispatch
from tests.e2e.session import log_in

pytestmark = pytest.mark.django_db(transaction=True)

ENGINE_START_S = 120_000  # ms: an engine launch on two busy cores


def test_set_the_learning_rate_of_a_running_job_from_its_page(
        page: Page, live_server_url, celery_worker, user, output_dir):
    spec = parse_spec({"name": "set-e2e", "model": {"preset": "nano"},
                       "parallel": {"nodes": 1, "procs_per_node": 2},
                       "train": {"steps": 2000, "micro_batch": 2, "seq_len": 32,
                                 "eval_every": 0, "threads": 1},
                       "checkpoint": {"every": 0}}).to_dict()
    job = Job.objects.create(name="set-e2e", owner=user, spec=spec)
    dispatch(job)
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/jobs/{job.pk}/")
    expect(page.locator("#state")).to_have_text("running", timeout=ENGINE_START_S)

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
