"""A person evaluates a finished job's checkpoint from its page: the Evaluate button queues it,
the evaluations card follows it to done with the held-out loss and perplexity per source, the
curve of held-out loss against the checkpoint's step holds it, and a reload shows the same."""

import pytest
from playwright.sync_api import Page, expect

from jobs.models import Evaluation
from tests.e2e.session import ENGINE_START_MS, open_running_job
from tests.policies import paced

pytestmark = pytest.mark.django_db(transaction=True)

# the checkpoint to evaluate is the run's last; a few paced steps (its ranks sleep nine tenths
# of each) keep it running long enough for the page to see it run, for little CPU
STEPS = 8

CURVE = "() => document.querySelector('#evaluations .chart').data.map((t) => [t.name, t.x, t.y])"


def test_evaluate_a_checkpoint_from_the_job_page(page: Page, live_server_url, celery_worker,
                                                 user, output_dir):
    open_running_job(page, live_server_url, user, "evaluate-e2e", steps=STEPS,
                     faults=paced(2))
    expect(page.locator("#state")).to_have_text("completed", timeout=ENGINE_START_MS)
    final = page.locator("#export-list li").first
    expect(final).to_contain_text(f"step {STEPS}", timeout=30_000)
    expect(page.locator("#evaluations")).to_be_hidden()

    final.locator("button.evaluate").click()
    row = page.locator("#evaluations tr").first
    expect(row).to_have_attribute("data-state", "done", timeout=120_000)
    evaluation = Evaluation.objects.get()
    (source, heldout), = evaluation.results["heldout"].items()
    expect(row).to_contain_text(f"step {STEPS}")
    expect(row).to_contain_text(f"{source}: {heldout['loss']:.3f} (ppl "
                                f"{heldout['perplexity']:.2f})")
    curve = page.evaluate(CURVE)
    assert curve == [[source, [STEPS], [pytest.approx(heldout["loss"])]]]
    page.screenshot(path=output_dir / "evaluated.png", full_page=True)

    page.reload()
    expect(page.locator("#evaluations tr[data-state=done]")).to_have_count(1, timeout=30_000)
    assert page.evaluate(CURVE) == curve
