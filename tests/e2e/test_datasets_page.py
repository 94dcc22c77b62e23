"""The Datasets page in Chromium: a dataset registered from the form, prepared on the real
worker with its progress and then its manifest on the page; and a job page's per-source chart
(loss and share of tokens of each source), drawn only for a job that trains on sources."""

import json

import pytest
from playwright.sync_api import Page, expect

from jobs.confinement import uploads_dir
from jobs.models import Job, State
from monitor.ingest import store_events
from tests.e2e.session import log_in
from tests.platform.services import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_dataset_registered_on_the_page_is_prepared_with_its_progress(
        page: Page, live_server_url, celery_worker, user, output_dir):
    folder = uploads_dir(user)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "web.jsonl").write_text("".join(
        json.dumps({"text": f"page {i} " + "words and more words " * 30}) + "\n"
        for i in range(300)))
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/datasets/")
    expect(page.locator("nav a", has_text="Datasets")).to_have_attribute("href", "/datasets/")
    form = page.locator("#register")
    form.locator("[name=name]").fill("web")
    form.locator("[name=kind]").select_option("jsonl")
    form.locator("[name=paths]").fill("/etc/passwd")
    form.locator("button").click()
    expect(page.locator("#register-error")).to_have_text(
        "sources.0.paths.0: not under your data roots")
    form.locator("[name=paths]").fill("*.jsonl")
    form.locator("button").click()
    row = page.locator("#dataset-rows tr", has_text="web")
    expect(row.locator(".state")).to_have_text("registered")
    row.locator("button", has_text="Prepare").click()
    expect(row.locator(".state")).to_have_text("preparing")
    expect(row.locator(".state")).to_have_text("ready", timeout=60_000)
    expect(row.locator(".progress-text")).to_contain_text("300 documents")
    expect(row.locator(".manifest")).to_contain_text("vocabulary 256")
    page.screenshot(path=output_dir / "datasets.png", full_page=True)


def step(job: Job, seq: int, number: int, **fields) -> dict:
    return {"type": "step", "job": str(job.pk), "step": number, "time": float(number),
            "seq": seq, "loss": 5.0 - number / 10, **fields}


def test_the_job_page_charts_each_sources_loss_and_share_only_when_it_has_sources(
        page: Page, live_server_url, user, output_dir):
    mixed = Job.objects.create(name="mixed", owner=user, spec=SMALL_SPEC, state=State.COMPLETED)
    plain = Job.objects.create(name="plain", owner=user, spec=SMALL_SPEC, state=State.COMPLETED)
    store_events(mixed.pk, [step(mixed, n, n, source_loss={"web": 5 - n / 10, "code": 4 - n / 9},
                                 source_tokens={"web": 300 * n, "code": 100 * n})
                            for n in range(1, 11)])
    store_events(plain.pk, [step(plain, n, n) for n in range(1, 11)])
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/jobs/{mixed.pk}/")
    chart = page.locator("#chart-sources")
    expect(page.locator("#sources-card")).to_be_visible()
    page.wait_for_function("() => document.getElementById('chart-sources').data?.length === 4")
    traces = page.evaluate("""() => document.getElementById('chart-sources').data.map(
        (t) => [t.name, t.yaxis ?? 'y', t.y.at(-1)])""")
    assert sorted(traces) == sorted([["web", "y", 4.0], ["code", "y", pytest.approx(4 - 10 / 9)],
                                     ["web", "y2", 0.75], ["code", "y2", 0.25]])
    expect(chart.locator(".gtitle")).to_have_text("Per source: loss and share of tokens seen")
    chart.screenshot(path=output_dir / "sources-chart.png")
    page.goto(f"{live_server_url}/jobs/{plain.pk}/")
    page.wait_for_function("() => document.getElementById('chart-loss').data?.length > 0")
    expect(page.locator("#sources-card")).to_be_hidden()
