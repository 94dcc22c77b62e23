"""A run with 100,000 stored steps and 20 rollbacks, opened in a real Chromium: seconds until
its job page draws every chart, until a reload shows its first full chart, until the drawn
page paints its next frame, until a zoom shows the window at full resolution, and until the
compare page draws the run.

    python -m bench.large_run [--reloads 3]

Stores the run in DATABASE_URL (unset: a SQLite file of the benchmark's own) beside a private
redis-server and serves it as `serve` does. Targets: drawn and compared within 8 s, reloaded
within 2 s, the next frame within 1 s, zoomed within 3 s. tests/e2e/test_large_run.py walks
the same pages and checks what they show. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Iterable
from typing import Any

from bench.platform_env import Platform, open_logged_in

STEPS = 100_000
RANKS = 2
SPIKE_STEP, SPIKE_LOSS = 73_217, 40.0
ANOMALY_STEPS = (SPIKE_STEP, 20_011, 88_888)
CHECKPOINT_EVERY = 2_500
# 20 rollbacks, each from 1,000 steps past a checkpoint back to it: a memory-tier checkpoint
# written on the way is abandoned, and the run trained again saves one of its own
ROLLBACK_TO = tuple(range(CHECKPOINT_EVERY, STEPS, 2 * CHECKPOINT_EVERY))
ZOOM = (50_000, 50_400)
TARGETS_S = {"drawn_s": 8.0, "reloaded_s": 2.0, "next_frame_s": 1.0, "zoomed_s": 3.0,
             "compare_drawn_s": 8.0}
# the charts of the series this run stores: drawn with points, the page is "full"
FULL_CHARTS = ("loss", "tokens_per_s", "grad_norm", "lr", "system")


def loss_at(step: int) -> float:
    return SPIKE_LOSS if step == SPIKE_STEP else 2.0 + 8.0 / math.sqrt(step) + 0.02 * math.sin(step)


def series_values(step: int) -> dict[str, float]:
    """What a 2-rank run reports each step (the ingest's series names)."""
    values = {"loss": loss_at(step), "tokens_per_s": 12_000 + 300 * math.sin(step / 50),
              "grad_norm": 1.0 + 0.2 * math.cos(step / 7),
              "lr": 1e-3 * 0.5 * (1 + math.cos(math.pi * step / STEPS))}
    for rank in range(RANKS):
        values[f"system.cpu_percent.rank{rank}"] = 95.0 + 10 * rank + 5 * math.sin(step / 30)
        values[f"system.rss_bytes.rank{rank}"] = 1.5e9 + 1e8 * rank
    return values


def insert_points(rows: Iterable[tuple[int, str, int, float]]) -> None:
    """Store (job id, name, step, value) metric points: 800,000 of them as model instances
    would take most of a minute, so with PostgreSQL's COPY, or SQLite's executemany."""
    from django.db import connection, transaction

    from monitor.models import MetricPoint

    table = MetricPoint._meta.db_table
    columns = "job_id, name, step, value"
    with transaction.atomic(), connection.cursor() as cursor:  # one commit, not one per row
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s)",
                               list(rows))
        # the planner statistics that autovacuum keeps for a table grown over a real run
        cursor.execute(f"ANALYZE {table}")


def store_large_run(owner: Any) -> Any:
    """A running job of `owner` with 100,000 steps stored, a few anomalies, actions (20 of
    them rollbacks) and checkpoints."""
    from django.utils import timezone

    from engine.runtime.spec import parse_spec
    from jobs.models import Job
    from monitor.ingest import store_events

    spec = parse_spec({"name": "large", "model": {"preset": "tiny"},
                       "parallel": {"nodes": 1, "procs_per_node": RANKS},
                       "train": {"steps": 2 * STEPS}}).to_dict()
    job = Job.objects.create(name="large", owner=owner, spec=spec, state="running", step=STEPS,
                             started_at=timezone.now())
    insert_points((job.pk, name, step, value) for step in range(1, STEPS + 1)
                  for name, value in series_values(step).items())
    events = [{"type": "anomaly", "step": step, "kind": "loss_spike", "severity": "warning",
               "rank": None, "evidence": {"loss": loss_at(step)}} for step in ANOMALY_STEPS]
    events.append({"type": "action", "step": SPIKE_STEP, "action": "skip_update",
                   "anomaly": "loss_spike", "by": "policy"})
    for step in range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY):
        events.append(checkpoint_event(step, "disk"))
        if step in ROLLBACK_TO:
            events += [checkpoint_event(step + 700, "memory"),
                       {"type": "action", "step": step, "action": "rollback", "by": "command",
                        "from_step": step + 1000, "to_step": step},
                       checkpoint_event(step + 500, "memory")]
    for seq, event in enumerate(events, start=1):
        event.update(job=str(job.pk), seq=seq, time=time.time())
    store_events(job.pk, events)
    return job


def checkpoint_event(step: int, tier: str) -> dict:
    return {"type": "checkpoint", "step": step, "path": f"/ckpt/{tier}/step-{step:08d}",
            "tier": tier, "blocking_s": 0.1, "size_bytes": 10**8, "strategy": "NNN",
            "world_size": RANKS}


# Installed before a navigation: window.firstFullChartMs, the page's clock at the first
# animation frame at which every chart in FULL_CHARTS holds a trace with points and the loss
# chart its checkpoint markers (the page's own clock starts at navigation start).
FULL_CHART_WATCH = """(() => {
  const charts = FULL_CHARTS;
  const drawn = (id) => document.getElementById(`chart-${id}`)?.data?.some(t => t.x.length > 0);
  const full = () => charts.every(drawn) && document.getElementById('chart-loss').data
    .some(t => t.name === 'checkpoints' && t.x.length > 0);
  const check = () => {
    if (full()) window.firstFullChartMs = performance.now();
    else if (performance.now() < 30000) requestAnimationFrame(check);
  };
  requestAnimationFrame(check);
})();""".replace("FULL_CHARTS", json.dumps(FULL_CHARTS))


def seconds_until(page: Any, condition: str, arg: object = None) -> float:
    """Seconds until the page's JavaScript `condition` (a function of `arg`) holds."""
    started = time.monotonic()
    page.wait_for_function(condition, arg=arg, timeout=30_000)
    return time.monotonic() - started


def open_job_page(page: Any, base_url: str, job_id: int) -> tuple[float, list[str]]:
    """Open the job's page: seconds until its loss and system charts hold points, and the
    frames its socket received by then (the snapshot first)."""
    frames: list[str] = []

    def watch(socket: Any) -> None:
        if socket.url.endswith(f"/ws/jobs/{job_id}/"):
            socket.on("framereceived", lambda data: frames.append(data))
    page.on("websocket", watch)
    started = time.monotonic()
    page.goto(f"{base_url}/jobs/{job_id}/")
    seconds_until(page, "['loss', 'system'].every(id => document.getElementById(`chart-${id}`)"
                        ".data?.some(t => t.x.length > 0))")
    return time.monotonic() - started, frames


def reload_to_the_first_full_chart_s(page: Any) -> float:
    """Reload the page (its files cached, as on a person's second visit): seconds from the
    reload's navigation start to its first full chart (FULL_CHART_WATCH)."""
    page.add_init_script(FULL_CHART_WATCH)
    page.reload()
    return page.wait_for_function("() => window.firstFullChartMs", timeout=30_000)\
        .json_value() / 1000


def load_breakdown(page: Any) -> dict[str, float]:
    """Seconds from navigation start to the page's milestones: its HTML parsed and scripts
    run (plotly's included), the snapshot received over the socket, and shown."""
    return page.evaluate("""() => {
        const nav = performance.getEntriesByType('navigation')[0];
        const mark = (name) => performance.getEntriesByName(name)[0]?.startTime ?? null;
        const s = (ms) => ms === null ? null : ms / 1000;
        return { response_end_s: s(nav.responseEnd),
                 dom_content_loaded_s: s(nav.domContentLoadedEventEnd),
                 snapshot_received_s: s(mark('snapshot-received')),
                 snapshot_shown_s: s(mark('snapshot-shown')) };
    }""")


def next_frame_s(page: Any) -> float:
    """Seconds until the page paints its next frame (a long task still running holds it)."""
    return seconds_until(
        page, "() => new Promise(resolve => requestAnimationFrame(() => resolve(true)))")


def zoom_s(page: Any) -> float:
    """Zoom the loss chart onto ZOOM: seconds until it draws every step of that window."""
    page.evaluate("([lo, hi]) => Plotly.relayout('chart-loss', {'xaxis.range': [lo, hi]})",
                  list(ZOOM))
    return seconds_until(
        page, "([lo, hi]) => { const x = document.getElementById('chart-loss').data"
              ".find(t => t.name === 'loss').x; return x[0] === lo && x.at(-1) === hi; }",
        list(ZOOM))


def open_compare_s(page: Any, base_url: str, job_id: int) -> float:
    """Open the compare page on the run: seconds until it draws it."""
    started = time.monotonic()
    page.goto(f"{base_url}/compare/?jobs={job_id}")
    seconds_until(page, f"document.getElementById('compare').dataset.drawn === '{job_id}'")
    return time.monotonic() - started


def walk(page: Any, base_url: str, job_id: int, reloads: int) -> dict[str, Any]:
    """Every figure of TARGETS_S, the reload's the median of `reloads`."""
    drawn, frames = open_job_page(page, base_url, job_id)
    reloaded = [reload_to_the_first_full_chart_s(page) for _ in range(reloads)]
    figures = {"drawn_s": drawn, "snapshot_bytes": len(frames[0]),
               "reloaded_s": statistics.median(reloaded), "reloaded_each_s": reloaded,
               "reloaded": load_breakdown(page), "next_frame_s": next_frame_s(page),
               "zoomed_s": zoom_s(page)}
    figures["compare_drawn_s"] = open_compare_s(page, base_url, job_id)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reloads", type=int, default=3)
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    with Platform() as platform:
        base = platform.web()
        stored = time.monotonic()
        job = store_large_run(platform.user)  # before Playwright's loop runs in this thread
        stored = time.monotonic() - stored
        with sync_playwright() as playwright:
            page = open_logged_in(playwright, base, platform.user.username)
            figures = walk(page, base, job.pk, args.reloads)
            page.context.browser.close()

    print(json.dumps({
        "benchmark": "large_run",
        "database": platform.database,
        "steps": STEPS, "stored_in_s": round(stored, 1),
        "figures": figures,
        "targets_s": TARGETS_S,
        "ratios": {f"{name}_vs_target": round(figures[name] / target, 3)
                   for name, target in TARGETS_S.items()},
        "met": all(figures[name] <= target for name, target in TARGETS_S.items()),
    }, indent=2))


if __name__ == "__main__":
    main()
