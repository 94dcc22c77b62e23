"""A loss spike whose rollback needs a person's approval (`faults.policy.approve`): the job page
shows the proposal with its evidence and deadline while the run holds, the person approves
it there, the run rolls back and goes on; the decision is in the audit log with their name."""

import pytest
from playwright.sync_api import Page, expect

from jobs.models import AuditEntry
from tests.e2e.session import ENGINE_START_MS, open_running_job

pytestmark = pytest.mark.django_db(transaction=True)

FAULTS = {"policy": {"actions": {"loss_spike": ["rollback"], "straggler": ["observe"]},
                     "approve": ["rollback"], "approve_timeout_s": 300},
          "inject": [{"kind": "loss_spike", "step": 8, "factor": 20}]}


def test_a_proposed_rollback_is_approved_from_the_job_page(
        page: Page, live_server_url, celery_worker, user, output_dir):
    job = open_running_job(page, live_server_url, user, "approve-e2e", steps=12, faults=FAULTS,
                           checkpoint_every=5)

    proposal = page.locator("#proposals li[data-status=pending]")
    expect(proposal).to_contain_text("Proposed rollback for loss_spike at step 8",
                                     timeout=ENGINE_START_MS)
    expect(proposal).to_contain_text("the run holds until then")
    expect(proposal).to_contain_text("value")  # the anomaly's evidence
    expect(page.locator("#step")).to_have_text("7")  # held at the spike's step boundary
    page.screenshot(path=output_dir / "proposed.png", full_page=True)

    proposal.locator("button.approve").click()
    decided = page.locator("#proposals li[data-status=approved]")
    expect(decided).to_contain_text("approved: took rollback at step 8", timeout=30_000)
    expect(page.locator("#proposals button")).to_have_count(0)
    expect(page.locator("#feed li[data-kind=rollback]")).to_contain_text("for loss_spike")
    expect(page.locator("#results li[data-kind=decide]")).to_contain_text(
        "Decision done at step 8: p-8-1 approved, took rollback")
    expect(page.locator("#state")).to_have_text("completed", timeout=60_000)
    page.screenshot(path=output_dir / "approved.png", full_page=True)

    entry = AuditEntry.objects.get(job=job, action="job.decide")
    assert entry.actor == user.username and entry.details["args"]["choice"] == "approve"
