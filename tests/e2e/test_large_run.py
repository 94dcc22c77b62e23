"""A run with 100,000 stored steps and 20 rollbacks: the job page draws it from a downsampled
snapshot (bounded in size, the one-step loss spike still in the envelope, every marker on the
loss chart, a line per rank), a reload draws it full again, zooming its loss chart onto a small
window fetches that window at full resolution, and the compare page overlays the run
downsampled. How fast is bench/large_run.py's to measure (it walks the same pages); the figures
seen here go to test-results/<test>/timings.json."""

import json

import pytest
from playwright.sync_api import Page

from bench.large_run import (
    ANOMALY_STEPS,
    CHECKPOINT_EVERY,
    RANKS,
    ROLLBACK_TO,
    SPIKE_LOSS,
    STEPS,
    ZOOM,
    loss_at,
    next_frame_s,
    open_compare_s,
    open_job_page,
    reload_to_the_first_full_chart_s,
    series_values,
    store_large_run,
    zoom_s,
)
from jobs.models import Job
from monitor.consumers import SNAPSHOT_POINTS
from tests.e2e.session import log_in

pytestmark = pytest.mark.django_db(transaction=True)

SNAPSHOT_MAX_BYTES = 1_000_000
COMPARE_MAX_POINTS = 1500  # compare.js asks the server for at most this many per series


@pytest.fixture
def large_job(user) -> Job:
    return store_large_run(user)


def trace(page: Page, chart: str, name: str) -> dict:
    """The x and y of the named trace of a drawn chart."""
    return page.evaluate(
        "([chart, name]) => { const t = document.getElementById(chart).data"
        ".find(t => t.name === name); return {x: t.x, y: t.y}; }", [chart, name])


def test_a_100k_step_run_draws_from_a_bounded_snapshot_zooms_to_full_resolution_and_compares(
        page, live_server_url, user, large_job, output_dir):
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/")  # the server has served a page: what is timed is the run's
    drawn_s, frames = open_job_page(page, live_server_url, large_job.pk)
    figures = {"drawn_s": drawn_s, "snapshot_bytes": len(frames[0])}

    snapshot = json.loads(frames[0])
    assert snapshot["type"] == "snapshot"
    assert len(frames[0]) < SNAPSHOT_MAX_BYTES
    assert {name: len(s["step"]) <= SNAPSHOT_POINTS for name, s in snapshot["series"].items()} \
        == dict.fromkeys(series_values(1), True)
    # the one-step spike survives the downsampling, in the envelope's max
    assert max(trace(page, "chart-loss", "loss max")["y"]) == SPIKE_LOSS
    assert len(trace(page, "chart-loss", "anomalies")["x"]) == len(ANOMALY_STEPS)
    assert len(trace(page, "chart-loss", "checkpoints")["x"]) \
        == STEPS // CHECKPOINT_EVERY + 2 * len(ROLLBACK_TO)
    assert len(trace(page, "chart-loss", "actions")["x"]) == 1 + len(ROLLBACK_TO)
    # the system chart: one CPU line per rank (the legend's entries)
    ranks = page.evaluate("document.getElementById('chart-system').data"
                          ".filter(t => t.showlegend).map(t => t.name)")
    assert ranks == [f"rank {r}" for r in range(RANKS)]
    # a reload draws every chart full again (the time it takes: bench.large_run)
    figures["reloaded_s"] = reload_to_the_first_full_chart_s(page)
    figures["next_frame_s"] = next_frame_s(page)

    figures["zoomed_s"] = zoom_s(page)
    zoomed = trace(page, "chart-loss", "loss")
    assert zoomed["x"] == list(range(ZOOM[0], ZOOM[1] + 1))  # every step: full resolution
    assert zoomed["y"] == pytest.approx([loss_at(s) for s in zoomed["x"]])
    page.screenshot(path=output_dir / "job-page-zoomed.png", full_page=True)

    figures["compare_drawn_s"] = open_compare_s(page, live_server_url, large_job.pk)
    compared = page.evaluate("document.getElementById('compare-loss').data[0].x.length")
    assert 0 < compared <= COMPARE_MAX_POINTS
    page.screenshot(path=output_dir / "compare.png", full_page=True)
    (output_dir / "timings.json").write_text(json.dumps(figures, indent=2))
