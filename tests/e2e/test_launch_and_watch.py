"""A person logs in, launches the tiny job from the form, watches the loss arrive live and
cancels the run from its page."""

import re

import pytest
from playwright.sync_api import expect

from tests.policies import paced

pytestmark = pytest.mark.django_db(transaction=True)


def test_launch_the_tiny_job_watch_its_loss_chart_fill_live_and_cancel_it(
        page, live_server_url, celery_worker, user, output_dir):
    page.goto(f"{live_server_url}/")  # a visitor gets the login form on the home page
    page.fill("input[name=username]", "ada")
    page.fill("input[name=password]", "pw-ada-123")
    page.click("button:has-text('Log in')")
    expect(page.locator("h1")).to_have_text("Jobs")

    page.click("text=New job")
    form = page.locator("#launch")
    form.locator("input[name=name]").fill("tiny-e2e")
    form.locator("select[name='model.preset']").select_option("tiny")
    form.locator("input[name='train.steps']").fill("0")
    form.locator("button[type=submit]").click()
    # the API's field error appears next to its field
    expect(form.locator("[data-error-for='train.steps']")).to_have_text(
        re.compile("must be at least 1"))
    page.screenshot(path=output_dir / "launch-form-error.png", full_page=True)

    for field, value in {"train.steps": "200", "train.micro_batch": "1", "train.seq_len": "32",
                         "checkpoint.every": "0"}.items():
        form.locator(f"input[name='{field}']").fill(value)
    # paced (its rank sleeps nine tenths of each step): the run only has to keep going while it
    # is watched, and leaves the cores to the browser and the other tests
    (fault,) = paced(1)["inject"]
    page.click("#add-fault")
    row = page.locator("#inject-rows .inject-row").last
    row.locator("[data-field=kind]").select_option(fault["kind"])
    for name in ("step", "rank", "factor"):
        row.locator(f"[data-field={name}]").fill(str(fault[name]))
    form.locator("button[type=submit]").click()
    expect(page).to_have_url(re.compile(r"/jobs/\d+/$"))

    job = page.locator("#job")
    expect(page.locator("#live")).to_have_text("live", timeout=15_000)
    # points arrive over the websocket while the page stays loaded (no reload, no polling)
    expect(job).to_have_attribute("data-live-steps", re.compile(r"^([3-9]|\d\d+)$"),
                                  timeout=120_000)
    points = page.evaluate(
        "document.getElementById('chart-loss').data.find(t => t.name === 'loss').y")
    assert len(points) >= 3 and all(isinstance(v, float) and v > 0 for v in points)
    # the rank's own CPU % (above) and RSS (below) on the system chart, filled by the same events
    system = page.evaluate("document.getElementById('chart-system').data"
                           ".map(t => [t.name, t.yaxis, t.y.filter(v => v > 0).length])")
    assert [(name, axis) for name, axis, _ in system] == [("rank 0", "y"), ("rank 0", "y2")]
    assert all(filled >= 3 for _, _, filled in system)
    page.screenshot(path=output_dir / "job-running.png", full_page=True)

    page.click("#cancel")
    # the engine may carry it out before the page is looked at: either word is the command's
    expect(page.locator("#action-result")).to_have_text(re.compile("Cancel (requested|done)"))
    expect(page.locator("#state")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#cancel")).to_be_disabled()
    expect(page.locator("#eta")).to_have_text("–")  # a cancelled job is not "done"
    page.screenshot(path=output_dir / "job-cancelled.png", full_page=True)

    page.click("nav >> text=Jobs")
    row = page.locator("table.jobs tbody tr", has_text="tiny-e2e")
    expect(row.locator(".state")).to_have_text("Cancelled")
    page.screenshot(path=output_dir / "job-list.png", full_page=True)

    page.click("nav >> text=Tokens")  # every page is in the navigation
    expect(page).to_have_url(re.compile(r"/tokens/$"))
