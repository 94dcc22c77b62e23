"""The ingest as a process of its own (`manage.py ingest`), killed with SIGKILL mid-stream and
started again: every event is stored exactly once, nothing is lost, nothing stays pending."""

import signal
import subprocess
import threading
import time

import pytest
from django.db import connection

from common.services import python_module
from engine.runtime.events import EventLog, events_stream
from monitor.ingest import GROUP
from monitor.models import Anomaly, Event, MetricPoint, OpsSample

pytestmark = pytest.mark.django_db(transaction=True)

TOTAL_STEPS = 1000  # each step publishes a step and an ops event; every 100th an anomaly
LEAD = 200


def publish(job_id: int, url: str, done: threading.Event) -> None:
    """The engine's side: a stream that keeps at most LEAD events ahead of what is stored, so
    the ingest is always mid-stream when it is killed (and the stream waits while it is down)."""
    log = EventLog(str(job_id), bus_url=url)
    try:
        for step in range(1, TOTAL_STEPS + 1):
            while log.seq - Event.objects.filter(job_id=job_id).count() > LEAD:
                time.sleep(0.02)
            log.emit_wire("step", step, loss=1.0 / step, grad_norm=1.0, lr=1e-3, tokens_per_s=1e4,
                     step_time=0.1, tokens=1000 * step, memory={"rss_bytes": 2**30})
            log.emit_wire("ops", step, step_ms=10.0, void_share=0.1, data_wait_share=0.0, ranks=[],
                     ops={"forward": {"kind": "compute", "total_ms": 8.0,
                                      "per_rank_ms": [8.0, 7.5]}})
            if step % 100 == 0:
                log.emit_wire("anomaly", step, kind="loss_spike", severity="warning", rank=None,
                         evidence={"z": 9.0})
    finally:
        log.close()
        connection.close()  # this thread's own; the test database is dropped at the end
        done.set()


def start_ingest(job_id: int, env: dict, consumer: str, claim_idle_ms: int) -> subprocess.Popen:
    return subprocess.Popen(
        python_module("django", "ingest", str(job_id), "--consumer", consumer,
                      "--claim-idle-ms", str(claim_idle_ms)),
        env={**env, "DJANGO_SETTINGS_MODULE": "ringside.settings"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def stored(job) -> int:
    return Event.objects.filter(job=job).count()


def test_a_killed_and_restarted_ingest_stores_every_event_exactly_once(
        job, bus, service_env, platform_redis_url, eventually):
    total = TOTAL_STEPS * 2 + TOTAL_STEPS // 100
    published = threading.Event()
    publisher = threading.Thread(target=publish, args=(job.pk, platform_redis_url, published))
    publisher.start()
    try:
        # killed twice mid-stream: restarted once under the same consumer name (it re-reads
        # its own unacknowledged entries) and once under another (it claims the dead one's)
        runs = [("ingest-a", 60_000, total // 3), ("ingest-a", 60_000, 2 * total // 3),
                ("ingest-b", 0, None)]
        for consumer, claim_idle_ms, kill_at in runs:
            proc = start_ingest(job.pk, service_env, consumer, claim_idle_ms)
            try:
                if kill_at is None:
                    eventually(lambda: stored(job) == total and published.is_set(), 60,
                               f"all {total} events stored ({stored(job)} so far)")
                else:
                    eventually(lambda n=kill_at: stored(job) >= n, 60,
                               f"{kill_at} events stored ({stored(job)} so far)")
                    assert stored(job) < total, "the kill must come mid-stream"
                    proc.send_signal(signal.SIGKILL)
            finally:
                if proc.poll() is None:
                    proc.terminate()
                proc.wait(15)
    finally:
        publisher.join()

    assert list(Event.objects.filter(job=job).order_by("seq").values_list("seq", flat=True)) \
        == list(range(1, total + 1))
    losses = MetricPoint.objects.filter(job=job, name="loss").order_by("step")
    assert list(losses.values_list("step", flat=True)) == list(range(1, TOTAL_STEPS + 1))
    assert OpsSample.objects.filter(job=job).count() == TOTAL_STEPS
    assert Anomaly.objects.filter(job=job).count() == TOTAL_STEPS // 100
    assert bus.xpending(events_stream(str(job.pk)), GROUP)["pending"] == 0
