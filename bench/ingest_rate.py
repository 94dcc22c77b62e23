"""Ingest throughput: events per second that the real ingest path stores.

    DATABASE_URL=postgresql://... .venv/bin/python -m bench.ingest_rate [--steps 2000] [--trials 3]

The engine's `EventLog` publishes `--steps` steps of a `tiny` 2x2 run into the job's Redis
stream first (per step a `step`, `experts` and `ops` event; checkpoints, anomalies and actions
among them: bench.platform_env.engine_events). Then one `StreamIngest` drains the stream as the
job supervisor does: read a batch with the consumer group and prepare its rows (the next batch
is read and prepared while this one is stored), `write` it (the events and their typed rows in
one transaction), acknowledge, forward to the job's channel-layer group. The figure is events
stored per second of that drain, with the database it went into (PostgreSQL when DATABASE_URL
names one, else SQLite) and the share of the time spent in `write`. The engine mix is drained
`--trials` times, each into a new job; every trial is listed, and the median is the figure
held against the target (one drain of 2,000 steps lasts about a second, and on a shared
2-core machine one such second measured anywhere from 3,600 to 6,400 events/s).
Target (issue 9): 5,000 events/s into PostgreSQL. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

from bench.platform_env import Platform, engine_events

TARGET_EVENTS_PER_S = 5000


def measure(platform: Platform, steps: int, batch: int, types: set[str] | None) -> dict:
    """Publish `steps` steps of engine events (only `types`, if given) into a new job's
    stream, then drain it with StreamIngest; what it stored and how fast."""
    import redis

    import monitor.ingest as ingest
    from engine.runtime.events import EventLog
    from monitor.models import Event

    job = platform.new_job()
    log = EventLog(str(job.pk), bus_url=platform.redis_url)
    kinds: collections.Counter[str] = collections.Counter()
    published_bytes = 0
    for type, step, fields in engine_events():
        if step > steps:
            break
        if types is None or type in types:
            kinds[type] += 1
            published_bytes += len(json.dumps(log.emit_wire(type, step, **fields)))
    log.close()
    published = sum(kinds.values())

    store_s = 0.0
    write = ingest.write

    def timed_write(job_id, batch):
        nonlocal store_s
        started = time.perf_counter()
        write(job_id, batch)
        store_s += time.perf_counter() - started

    ingest.write = timed_write  # the real function, timed
    client = redis.Redis.from_url(platform.redis_url)
    try:
        reader = ingest.StreamIngest(job.pk, client)
        started = time.perf_counter()
        stored = 0
        while batch_read := reader.poll(block_ms=None, count=batch):
            stored += len(batch_read)
        elapsed = time.perf_counter() - started
    finally:
        ingest.write = write
        client.close()
    in_database = Event.objects.filter(job=job).count()
    return {
        "events": published,
        "mix": dict(kinds),
        "mean_event_bytes": round(published_bytes / published),
        "drain_s": round(elapsed, 3),
        "write_share": round(store_s / elapsed, 3),
        "stored_once_each": in_database == published == stored,
        "events_per_s": round(stored / elapsed),
        "mb_per_s": round(published_bytes / elapsed / 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="engine steps published")
    parser.add_argument("--batch", type=int, default=500, help="events read per poll")
    parser.add_argument("--trials", type=int, default=3,
                        help="drains of the engine mix, each into a new job (the median counts)")
    args = parser.parse_args()

    with Platform() as platform:
        trials = [measure(platform, args.steps, args.batch, types=None)
                  for _ in range(args.trials)]
        step_only = measure(platform, args.steps, args.batch, types={"step"})
        rate = statistics.median(trial["events_per_s"] for trial in trials)
        print(json.dumps({
            "benchmark": "ingest_rate",
            "database": platform.database,
            "batch": args.batch,
            "engine_mix": {"median_events_per_s": rate, "trials": trials},
            "step_events_only": step_only,
            "target_events_per_s": TARGET_EVENTS_PER_S,
            "target_database": "postgresql",
            "met": rate >= TARGET_EVENTS_PER_S and platform.database == "postgresql",
        }, indent=2))


if __name__ == "__main__":
    main()
