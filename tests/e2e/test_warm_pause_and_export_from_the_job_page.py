"""A person pauses a running job warm from its page (the label says so), resumes it in its
running engine, lets it finish, and exports its final checkpoint from the checkpoint list: the
row shows the export's state, then the model folder."""

import re

import pytest
from django.conf import settings
from playwright.sync_api import Page, expect

from tests.e2e.session import ENGINE_START_MS, open_running_job
from tests.policies import paced

pytestmark = pytest.mark.django_db(transaction=True)

# a run to pause while it runs and to see run again after: paced (its ranks sleep nine tenths
# of each step), 50 steps last about as long as the 300 unpaced ones this test ran before
STEPS = 50


def test_pause_warm_resume_and_export_from_the_job_page(
        page: Page, live_server_url, celery_worker, user, output_dir):
    job = open_running_job(page, live_server_url, user, "warm-e2e", steps=STEPS,
                           faults=paced(2))

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

    expect(page.locator("#state")).to_have_text("completed", timeout=ENGINE_START_MS)
    final = page.locator("#export-list li").first
    expect(final).to_contain_text(f"step {STEPS}", timeout=30_000)
    final.locator("button.export").click()
    out_dir = settings.RUNS_DIR / str(job.pk) / "exports" / f"step-{STEPS:06d}"
    expect(final).to_have_attribute("data-export-state", "done", timeout=120_000)
    expect(final).to_contain_text(f"done: {out_dir}")
    assert (out_dir / "config.json").exists() and (out_dir / "model.safetensors").exists()
    page.screenshot(path=output_dir / "exported.png", full_page=True)
