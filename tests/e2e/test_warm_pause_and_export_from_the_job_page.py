"""A person pauses a running job warm from its page (the label says so), resumes it in its
running engine, lets it finish, and exports its final checkpoint from the checkpoint list: the
row shows the export's state, then the model folder."""

import re

import pytest
from django.conf import settings
from playwright.sync_api import Page, expect

from engine.runtime.spec import parse_spec
from jobs.models import Job
from jobs.tasks import dispatch
from tests.e2e.session import log_in

pytestmark = pytest.mark.django_db(transaction=True)

ENGINE_START_S = 120_000  # ms: an engine launch on two busy cores


def test_pause_warm_resume_and_export_from_the_job_page(
        page: Page, live_server_url, celery_worker, user, output_dir):
    spec = parse_spec({"name": "warm-e2e", "model": {"preset": "nano"},
                       "parallel": {"nodes": 1, "procs_per_node": 2},
                       "train": {"steps": 300, "micro_batch": 2, "seq_len": 32,
                                 "eval_every": 0, "threads": 1},
                       "checkpoint": {"every": 0}}).to_dict()
    job = Job.objects.create(name="warm-e2e", owner=user, spec=spec)
    dispatch(job)
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/jobs/{job.pk}/")
    expect(page.locator("#state")).to_have_text("running", timeout=ENGINE_START_S)

    page.click("#pause-warm")
    expect(page.locator("#state")).to_have_text("paused (warm)", timeout=60_000)
    for button in ("#pause", "#pause-warm"):
        expect(page.locator(button)).to_be_disabled()
    expect(page.locator("#resume")).to_be_enabled()
    page.screenshot(path=output_dir / "paused-warm.png", full_page=True)
    page.click("#resume")
    expect(page.locator("#state")).to_have_text("running", timeout=30_000)
    expect(page.locator("#results li[data-kind=resume][data-state=done]")).to_contain_text(
        re.compile(r"Resume done at step \d+"), timeout=30_000)

    expect(page.locator("#state")).to_have_text("completed", timeout=ENGINE_START_S)
    final = page.locator("#export-list li").first
    expect(final).to_contain_text("step 300", timeout=30_000)
    final.locator("button.export").click()
    out_dir = settings.RUNS_DIR / str(job.pk) / "exports" / "step-000300"
    expect(final).to_have_attribute("data-export-state", "done", timeout=120_000)
    expect(final).to_contain_text(f"done: {out_dir}")
    assert (out_dir / "config.json").exists() and (out_dir / "model.safetensors").exists()
    page.screenshot(path=output_dir / "exported.png", full_page=True)
