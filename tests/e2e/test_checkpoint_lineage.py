"""The job page's Checkpoints card: each checkpoint's lineage row opens to what made it and the
checkpoints it came from, named by their ids."""

import pytest
from playwright.sync_api import Page, expect

from engine.checkpoint.layout import MANIFEST
from jobs.models import Checkpoint, Job
from monitor.ingest import store_events
from tests.e2e.session import log_in
from tests.platform.monitor.test_lineage import ORIGIN, saved

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_checkpoints_lineage_row_names_its_parents(page: Page, live_server_url, user,
                                                     small_spec, output_dir, tmp_path):
    origin = Job.objects.create(name="origin", owner=user, spec=small_spec, state="completed")
    store_events(origin.pk, [{**saved(origin, 1, 7, []), "path": ORIGIN}])
    job = Job.objects.create(name="child", owner=user, spec=small_spec, state="completed")
    init = {"kind": "init_from", "path": ORIGIN, "step": 7}
    five = f"/runs/{job.pk}/checkpoints/step-000005"
    ten = tmp_path / "step-000010"  # still stored: the card lists it
    ten.mkdir()
    (ten / MANIFEST).write_text("{}")
    store_events(job.pk, [saved(job, 1, 5, [init]),
                          {**saved(job, 2, 10, [{"kind": "rollback", "path": five, "step": 5},
                                                init]), "path": str(ten)}])
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/jobs/{job.pk}/")

    five_id = Checkpoint.objects.get(job=job, step=5).pk
    ten_id = Checkpoint.objects.get(job=job, step=10).pk
    row = page.locator(f"#export-list li[data-checkpoint-id='{ten_id}'] details.lineage")
    row.locator("summary").click()
    parents = row.locator(".lineage-parents li")
    expect(parents).to_have_count(2)
    origin_id = Checkpoint.objects.get(job=origin).pk
    expect(parents.nth(0)).to_have_text(
        f"rollback from checkpoint {five_id} of job {job.pk} (step 5)")
    expect(parents.nth(1)).to_have_text(
        f"init_from from checkpoint {origin_id} of job {origin.pk} (step 7)")
    expect(row.locator("[data-source=web]")).to_contain_text("1,280 tokens")
    page.screenshot(path=output_dir / "checkpoint-lineage.png", full_page=True)
