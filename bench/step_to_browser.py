"""Step event to browser: from the engine's publish to the loss chart drawn with that step.

    DATABASE_URL=postgresql://... .venv/bin/python -m bench.step_to_browser [--rate 5]
                                                                            [--seconds 20]

The whole path as a user sees it: the engine's `EventLog` publishes into the job's Redis
stream, `manage.py ingest` stores the event and forwards it through the channel layer, the web
server sends it down the job page's websocket, the page's scripts draw it. A real Chromium
(Playwright, as the e2e tests drive it) logs in and opens the job page; on the loss chart a
`plotly_afterplot` listener notes, with Date.now(), when each step first appears in the drawn
loss trace. The publisher sends `--rate` steps per second for `--seconds`, each step with the
events the engine sends with it (step, experts, ops; checkpoints, anomalies and actions now and
then: bench.platform_env.engine_events), and the delay of a step is the time it was drawn minus
the `time` the engine stamped on its step event (same host, same clock). Target (issue 9):
p50 <= 100 ms, p99 <= 250 ms. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import time

from bench.platform_env import Platform, distribution, engine_events, open_logged_in

TARGET_P50_MS = 100.0
TARGET_P99_MS = 250.0
DRAIN_TIMEOUT_S = 10.0

# In the page: the first time each step is in the drawn loss trace (the one named "loss").
RECORD_DRAWN_STEPS = """() => {
  window.drawnAt = {};
  const chart = document.getElementById("chart-loss");
  chart.on("plotly_afterplot", () => {
    const now = Date.now();
    const loss = chart.data.find((trace) => trace.name === "loss");
    for (const step of loss?.x ?? []) window.drawnAt[step] ??= now;
  });
}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=5.0, help="steps published per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    with Platform() as platform, sync_playwright() as playwright:
        from engine.runtime.events import EventLog

        base = platform.web()
        job = platform.job
        platform.ingest(job.pk)
        page = open_logged_in(playwright, base, platform.user.username)
        page.goto(f"{base}/jobs/{job.pk}/")
        page.wait_for_function("document.getElementById('live').textContent === 'live'")
        page.wait_for_function("document.getElementById('chart-loss').on !== undefined")
        page.evaluate(RECORD_DRAWN_STEPS)

        log = EventLog(str(job.pk), bus_url=platform.redis_url)
        published: dict[int, float] = {}  # step -> publish time (ms since the epoch)
        events = engine_events()
        steps = int(args.rate * args.seconds)
        started = time.monotonic()
        for type, step, fields in events:
            if step > steps:
                break
            if type == "step":  # a steady pace of steps; the step's other events follow it
                time.sleep(max(0.0, started + (step - 1) / args.rate - time.monotonic()))
            event = log.emit_wire(type, step, **fields)
            if type == "step":
                published[step] = event["time"] * 1000
        log.close()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            drawn = {int(k): v for k, v in page.evaluate("window.drawnAt").items()}
            if all(step in drawn for step in published):
                break
            page.wait_for_timeout(200)
        page.context.browser.close()

    delays = distribution([drawn[s] - t for s, t in published.items() if s in drawn])
    print(json.dumps({
        "benchmark": "step_to_browser",
        "database": platform.database,
        "steps_per_s": args.rate,
        "steps_published": len(published),
        "steps_drawn": sum(s in drawn for s in published),
        "delay_ms": delays,
        "target_p50_ms": TARGET_P50_MS,
        "target_p99_ms": TARGET_P99_MS,
        "met": len(drawn.keys() & published.keys()) == len(published)
        and delays["p50"] <= TARGET_P50_MS and delays["p99"] <= TARGET_P99_MS,
    }, indent=2))


if __name__ == "__main__":
    main()
