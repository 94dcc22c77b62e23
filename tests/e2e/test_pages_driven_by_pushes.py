"""The pages follow pushed changes and stay true: the job list's socket stays open while
nothing happens (an open note edit survives a pushed change), and a rollback pressed on the job
page is shown done, with its abandoned checkpoints and charts cut back to the live branch, from
what the job's socket pushes: at most two HTTP requests after the command's POST."""

import re

import pytest
from playwright.sync_api import Page, expect

from jobs.models import Cause, Job
from tests.e2e.session import log_in, off_the_page_thread, open_running_job
from tests.platform.services import SMALL_SPEC
from tests.policies import paced

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_S = 60  # longer than any timeout between the page, the server and Redis
REQUESTS_AFTER_A_ROLLBACK = 2  # the metrics refetch (the stored series trained again)


def test_the_job_list_stays_connected_while_idle_and_a_push_keeps_an_open_note_edit(
        page: Page, live_server_url, user, output_dir):
    job = Job.objects.create(name="idle", owner=user, spec=SMALL_SPEC)
    log_in(page, live_server_url, user)
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    page.goto(f"{live_server_url}/")
    row = page.locator(f"tr[data-job-id='{job.pk}']")
    expect(row.locator(".state")).to_have_text("Queued")
    row.locator(".edit").click()
    row.locator("textarea[name=note]").fill("half-written thought")

    page.wait_for_timeout(IDLE_S * 1000)
    assert [url for url in sockets if url.endswith("/ws/jobs/")] == [
        f"{live_server_url.replace('http', 'ws')}/ws/jobs/"]  # opened once, never again

    off_the_page_thread(lambda: job.request_cancel(Cause.USER, "ada"))
    expect(row.locator(".state")).to_have_text("Cancelled")
    expect(row.locator("textarea[name=note]")).to_have_value("half-written thought")
    page.screenshot(path=output_dir / "list-after-a-minute.png", full_page=True)


def record_draws(page: Page) -> None:
    """window.draws: [chart, the newest step it shows, the page's live step] at each draw of
    the per-op chart and the expert-load heatmap."""
    page.evaluate("""() => {
        window.draws = [];
        const react = Plotly.react;
        const live = () => Number(document.getElementById('step').textContent);
        Plotly.react = function (div, data, ...rest) {
            const id = typeof div === 'string' ? div : div.id;
            const drawn = react.call(this, div, data, ...rest);
            if (id === 'chart-ops' && data.length) {
                window.draws.push(['ops', Math.max(...data.flatMap(t => t.x)), live()]);
            }
            const label = document.getElementById('experts-label').textContent.match(/step (\\d+)/);
            if (id === 'chart-experts' && label) {
                window.draws.push(['experts', Number(label[1]), live()]);
            }
            return drawn;
        };
    }""")


def test_a_rollback_pressed_on_the_job_page_costs_at_most_two_requests(
        page: Page, live_server_url, celery_worker, user, output_dir):
    open_running_job(page, live_server_url, user, "rollback-requests", steps=2000,
                     faults=paced(2, 20), checkpoint_every=3)
    # the middle one of the three checkpoints retention keeps (the next one written deletes
    # the oldest): the rollback goes back past the newest
    listed = page.locator("#checkpoint-list li[data-step]")
    expect(listed).to_have_count(3, timeout=120_000)
    page.click("#rollback")
    listed.nth(1).locator("input[type=radio]").check()
    expect(page.locator("#rollback-picked")).to_contain_text("checkpoint of step")

    after_post: list[str] = []
    posted = []

    def on_request(request) -> None:
        if posted:
            after_post.append(f"{request.method} {request.url}")
        elif request.method == "POST" and request.url.endswith("/rollback/"):
            posted.append(request.url)

    page.on("request", on_request)
    record_draws(page)
    page.click("#rollback-go")
    rollback = page.locator("#results li[data-kind=rollback]").first
    expect(rollback).to_have_attribute("data-state", "done", timeout=60_000)
    # shown done: the result line, the abandoned branch in the picker, the state history
    expect(page.locator("#action-result")).to_have_attribute("data-kind", "rollback")
    expect(page.locator("#checkpoint-list li[data-branch=abandoned]").first).to_be_visible()
    expect(page.locator("#history")).to_contain_text("rolled back from step")
    expect(page.locator("#state")).to_have_text("running")
    (output_dir / "requests-after-the-rollback.txt").write_text("\n".join(after_post) + "\n")
    assert len(after_post) <= REQUESTS_AFTER_A_ROLLBACK, after_post
    page.screenshot(path=output_dir / "rolled-back.png", full_page=True)

    # the op chart and the expert heatmap, redrawn while the run trains the abandoned steps
    # again, show none of them past the live step
    from_step = int(re.search(r"step (\d+) →", rollback.inner_text()).group(1))
    page.wait_for_function("""from => ['ops', 'experts'].every(chart => window.draws
        .some(([drawn, , live]) => drawn === chart && live < from))""", arg=from_step,
        timeout=30_000)
    draws = page.evaluate("window.draws")
    (output_dir / "draws-after-the-rollback.txt").write_text(
        "\n".join(" ".join(map(str, d)) for d in draws) + "\n")
    assert [d for d in draws if d[1] > d[2]] == [], (from_step, draws)
    page.click("#cancel")
    expect(page.locator("#state")).to_have_text("cancelled", timeout=60_000)
