"""The job page's goodput card: a stacked bar and a row per cause, growing while the job runs,
the same after a reload once it is finished, each cause linking to the events behind it."""

import pytest
from playwright.sync_api import Page, expect

from monitor.goodput import CAUSES
from tests.e2e.session import ENGINE_START_MS, open_running_job
from tests.policies import paced

pytestmark = pytest.mark.django_db(transaction=True)

# a run that still trains while the card is watched grow: paced (its ranks sleep nine tenths
# of each step), 40 steps last about as long as the 200 unpaced ones this test ran before
STEPS = 40

RECORD = """() => ({
  rows: [...document.querySelectorAll('#goodput-table tr')].map((r) => r.innerText),
  bars: (document.getElementById('chart-goodput').data || []).map((t) => [t.name, t.x[0]]),
  title: document.querySelector('#chart-goodput .gtitle')?.textContent,
})"""


def productive_seconds(page: Page) -> float:
    text = page.locator("#goodput-table tr[data-cause=productive] td.num").first.inner_text()
    return float(text.removesuffix(" s"))


def test_the_goodput_card_grows_live_and_a_reload_shows_the_same(page: Page, live_server_url,
                                                                 celery_worker, user,
                                                                 output_dir):
    job = open_running_job(page, live_server_url, user, "goodput-card", steps=STEPS,
                           faults=paced(2))
    rows = page.locator("#goodput-table tr")
    expect(rows).to_have_count(len(CAUSES))
    page.wait_for_function("() => Number(document.querySelector("
                           "'#goodput-table tr[data-cause=productive] td.num')"
                           ".textContent.split(' ')[0]) > 0", timeout=60_000)
    before = productive_seconds(page)
    page.wait_for_timeout(1_500)
    assert productive_seconds(page) > before  # the open interval grows with the clock
    assert page.locator("#chart-goodput .trace.bars").count() >= 3  # queue, startup, training
    page.screenshot(path=output_dir / "goodput-live.png", full_page=True)

    expect(page.locator("#state")).to_have_text("completed", timeout=ENGINE_START_MS)
    page.wait_for_timeout(1_500)  # the ledger of the final state arrives after the state
    live = page.evaluate(RECORD)
    page.reload()
    expect(rows).to_have_count(len(CAUSES))
    assert page.evaluate(RECORD) == live

    link = page.locator("#goodput-table tr[data-cause=queue] a")
    assert link.get_attribute("href") == f"/api/jobs/{job.pk}/goodput/events/?cause=queue"
    body = page.request.get(f"{live_server_url}{link.get_attribute('href')}").json()
    assert [t["to_state"] for t in body["transitions"]] == ["starting"]
