"""A job page opened (or reloaded) after the fact shows what a page that watched the run live
showed: every chart's traces, the markers, the Commands card, the anomaly feed and the state
history. The run has it all: an injected loss spike (anomaly and policy action), checkpoints,
a rollback, a reshard onto another strategy, pinned shares of the batch (a rebalance), a pause
and a resume (all through the API) and a rank crash that restarts the ranks. It is compared
twice: paused mid-run, with a page opened then, and finished, with the watching page reloaded.
The same run checks that the per-op time stack adds up to each step's time."""

import re
import statistics

import pytest
from django.db.models import Max
from playwright.sync_api import Page, expect

from jobs.models import Job, State
from monitor.models import Event, OpsSample
from tests.e2e.session import ENGINE_START_MS, log_in, off_the_page_thread
from tests.policies import paced

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 36
CRASH_AT = 28
# The steering needs steps slow enough to land each command between two waits: the nano model
# paced (its ranks sleep nine tenths of each step, evenly: stragglers only observed) steps
# about as fast as `tiny` computes, for a ninth of its CPU. Paced up to the crash (the pause,
# steered at step 20, lands before it); the steps trained after the crash restart run at full
# speed, so the op stack's check has steps without the injected slowdown too.
PACED = paced(2, until=CRASH_AT - 1)
SPEC = {"name": "reload-e2e", "model": {"preset": "nano"},
        "parallel": {"nodes": 1, "procs_per_node": 2, "strategy": "NNG"},
        "train": {"steps": STEPS, "micro_batch": 2, "seq_len": 64, "warmup": 5,
                  "eval_every": 0, "threads": 1},
        "checkpoint": {"every": 5, "keep": 3},
        "faults": {**PACED, "inject": [
            *PACED["inject"], {"kind": "loss_spike", "step": 7, "rank": 1, "factor": 10},
            {"kind": "crash", "step": CRASH_AT, "rank": 1}]}}
PINNED = [3, 1]  # samples per step of each rank: the global batch of 2 x 2, unevenly

# What a person sees: each chart's traces (x/y, or z for heatmaps, by trace name) and the
# rows of each card.
RECORD = """() => {
  const charts = {};
  for (const div of document.querySelectorAll('.chart')) {
    charts[div.id] = (div.data || []).map((t) => ({
      name: t.name ?? '', x: Array.from(t.x ?? []), y: Array.from(t.y ?? []),
      z: t.z ?? null, text: t.text ?? null }));
  }
  const rows = (selector) => [...document.querySelectorAll(selector)].map((e) => e.innerText);
  return {
    charts,
    commands: rows('#results li'),
    feed: rows('#feed li'),
    history: rows('#history tr'),
    checkpoints: rows('#checkpoint-list li'),
    experts: document.getElementById('experts-label').textContent,
    state: document.getElementById('state').textContent,
    step: document.getElementById('step').textContent,
  };
}"""


def steer(api, job_id: int, kind: str, body: dict | None = None) -> None:
    # as another client would: its pushes (the command, the state change) reach the page
    response = off_the_page_thread(
        lambda: api.post(f"/api/jobs/{job_id}/{kind}/", body or {}, format="json"))
    assert response.status_code == 202, response.content


def wait_for_step(page: Page, step: int) -> None:
    page.wait_for_function("s => Number(document.getElementById('step').textContent) >= s",
                           arg=step, timeout=ENGINE_START_MS)


def first_difference(live, reloaded) -> str:
    if isinstance(live, list) and isinstance(reloaded, list):
        for i, (a, b) in enumerate(zip(live, reloaded, strict=False)):
            if a != b:
                return f"[{i}] {first_difference(a, b)}"
        return f"live has {len(live)} items, reloaded {len(reloaded)}"
    if isinstance(live, dict) and isinstance(reloaded, dict):
        key = next(k for k in {*live, *reloaded} if live.get(k) != reloaded.get(k))
        return f"{key}: {first_difference(live.get(key), reloaded.get(key))}"
    return f"live {live!r} / reloaded {reloaded!r}"[:400]


def differences(live: dict, reloaded: dict) -> list[str]:
    """Where the two pages differ: the first difference of each card and chart."""
    keys = [k for k in live if k != "charts"]
    found = [f"{k}: {first_difference(live[k], reloaded[k])}" for k in keys
             if live[k] != reloaded[k]]
    return found + [f"{chart}: {first_difference(traces, reloaded['charts'].get(chart))}"
                    for chart, traces in live["charts"].items()
                    if traces != reloaded["charts"].get(chart)]


def settled_view(page: Page, job_id: int) -> dict:
    """What `page` shows once it holds every stored event of the job and its throttled charts
    have drawn them (the ingest may still be storing the last events when the state moves)."""
    last_seq = Event.objects.filter(job_id=job_id).aggregate(Max("seq"))["seq__max"]
    expect(page.locator("#job")).to_have_attribute("data-seq", str(last_seq), timeout=30_000)
    page.wait_for_timeout(2_000)
    return page.evaluate(RECORD)


def opened_now(page: Page, url: str, job_id: int, commands: int) -> dict:
    """What a page opened now on the job shows, in a second tab beside `page`."""
    fresh = page.context.new_page()
    fresh.goto(url)
    expect(fresh.locator("#results li")).to_have_count(commands)
    view = settled_view(fresh, job_id)
    fresh.close()
    return view


def assert_the_op_stack_adds_up(bars: list[dict], job_id: int) -> None:
    """Every kept step's bars add up to its step time, and no op is counted inside another.
    The bars are means over ranks (a rank's compute, collectives and data wait are its whole
    step), so they add up to the mean rank's step time: the ranks end a step within
    milliseconds of each other, more apart on a busy machine than the 1% allowed here."""
    seqs = dict(OpsSample.objects.filter(job_id=job_id).values_list("step", "seq"))
    ranks = {e.seq: e.data["ranks"] for e in Event.objects.filter(job_id=job_id,
                                                                  seq__in=seqs.values())}
    steps = bars[0]["x"]
    assert len(steps) >= STEPS - 2
    for i, step in enumerate(steps):
        mean_step_ms = statistics.fmean(r["step_ms"] for r in ranks[seqs[step]])
        assert sum(trace["y"][i] for trace in bars) == pytest.approx(mean_step_ms, rel=0.01)
    names = {trace["name"] for trace in bars}
    assert {"forward", "backward", "other compute"} <= names
    assert "forward_backward" not in names


def test_a_reloaded_job_page_shows_what_the_live_one_showed_and_the_op_stack_adds_up(
        page: Page, live_server_url, celery_worker, user, api, output_dir, eventually):
    log_in(page, live_server_url, user)
    created = api.post("/api/jobs/", SPEC, format="json")
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    url = f"{live_server_url}/jobs/{job_id}/"
    page.goto(url)
    # before its first step the page says what it waits for
    expect(page.locator("#chart-loss")).to_contain_text("waiting for the first step")
    page.screenshot(path=output_dir / "0-waiting.png", full_page=True)

    expect(page.locator("#state")).to_have_text("running", timeout=ENGINE_START_MS)
    wait_for_step(page, 12)
    steer(api, job_id, "rollback", {"step": 10, "skip_data": True})
    expect(page.locator("#feed li[data-kind=rollback]")).to_have_count(1, timeout=60_000)
    wait_for_step(page, 14)
    steer(api, job_id, "reshard", {"strategy": "GGG", "nodes": 1, "procs_per_node": 2})
    expect(page.locator("#feed li[data-kind=reshard]")).to_have_count(1, timeout=60_000)
    # stepping on the new layout: the job runs again (the page may not know it resharded yet)
    eventually(lambda: Job.objects.filter(pk=job_id, state=State.RUNNING, step__gte=16).exists(),
               ENGINE_START_MS / 1000, f"job {job_id} did not run on its new layout")
    steer(api, job_id, "rebalance", {"shares": PINNED})
    wait_for_step(page, 20)
    steer(api, job_id, "pause")
    expect(page.locator("#state")).to_have_text("paused", timeout=ENGINE_START_MS)
    # mid-run: a page opened on the paused job equals the one that watched
    paused = settled_view(page, job_id)
    assert not differences(paused, opened_now(page, url, job_id, 4))

    steer(api, job_id, "resume")
    # the injected crash restarts the ranks from the newest checkpoint
    expect(page.locator("#feed li[data-kind=restart]")).to_have_count(1, timeout=ENGINE_START_MS)
    expect(page.locator("#state")).to_have_text("completed", timeout=3 * ENGINE_START_MS)
    expect(page.locator("#results li")).to_have_count(5)
    live = settled_view(page, job_id)
    page.screenshot(path=output_dir / "1-live.png", full_page=True)

    page.reload()
    expect(page.locator("#live")).to_have_text("finished")
    expect(page.locator("#results li")).to_have_count(5)
    reloaded = settled_view(page, job_id)
    page.screenshot(path=output_dir / "2-reloaded.png", full_page=True)
    assert not differences(live, reloaded), differences(live, reloaded)
    assert live["charts"]["chart-memory"] and live["charts"]["chart-system"]
    assert all("done" in row for row in live["commands"]), live["commands"]
    # the pinned shares are kept by the checkpoints the pause and the restart resumed from (the
    # fault policy may follow the ranks' speeds after them)
    shares = live["charts"]["chart-shares"]
    assert [t["name"] for t in shares] == ["rank 0", "rank 1"]
    assert PINNED in [list(point) for point in zip(*(t["y"] for t in shares), strict=True)]
    feed_steps = [int(re.match(r"step (\d+)", row).group(1)) for row in live["feed"]]
    assert feed_steps == sorted(feed_steps, reverse=True)
    assert_the_op_stack_adds_up(live["charts"]["chart-ops"], job_id)
