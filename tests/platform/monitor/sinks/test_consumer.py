"""A job's sinks as its supervisor runs them: a thread per sink following the stream, caught
up and closed once the engine exited; `catch_up` finishes what a stopped sink left."""

import os
import sys

import pytest

from engine import contract
from monitor.sinks import consumer
from monitor.sinks.models import Sink, SinkKind, SinkState
from monitor.sinks.trackers import tensorboard_dir
from tests.platform.monitor.sinks.conftest import publish_run, write_all

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_sink_follows_the_stream_on_its_thread_and_closes_once_caught_up(
        job, platform_redis_url, eventually):
    sink = Sink.objects.create(job=job, kind=SinkKind.TENSORBOARD)
    runners = consumer.start(job.pk, platform_redis_url)
    publish_run(job, platform_redis_url, steps=range(1, 4))
    eventually(lambda: Sink.objects.get(pk=sink.pk).last_seq == 3, 30,
               "the sink did not follow the stream")
    publish_run(job, platform_redis_url, steps=range(4, 7))  # the engine's last events
    consumer.stop(runners)
    for runner in runners:
        runner.join(30)
    sink.refresh_from_db()
    assert (sink.state, sink.last_seq, sink.last_error) == (SinkState.CLOSED, 9, "")
    assert any(tensorboard_dir(job).iterdir())


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_a_sinks_thread_runs_below_trainings_cpu_priority(job, platform_redis_url, eventually):
    Sink.objects.create(job=job, kind=SinkKind.TENSORBOARD)
    training = os.getpriority(os.PRIO_PROCESS, 0)  # this process's: its main thread's
    (runner,) = consumer.start(job.pk, platform_redis_url)
    try:
        eventually(lambda: os.getpriority(os.PRIO_PROCESS, runner.native_id)
                   == max(consumer.SINK_NICENESS, training), 10,
                   "the sink's thread kept training's priority")
        assert os.getpriority(os.PRIO_PROCESS, 0) == training
    finally:
        consumer.stop([runner])
        runner.join(30)


def test_catch_up_writes_what_a_stopped_sink_left_pending(job, platform_redis_url):
    sink = Sink.objects.create(job=job, kind=SinkKind.TENSORBOARD, state=SinkState.FAILING,
                               last_error="ConnectionError: gone")
    publish_run(job, platform_redis_url)
    assert consumer.catch_up.apply(args=[sink.pk]).get() == SinkState.CLOSED
    sink.refresh_from_db()
    assert (sink.state, sink.last_seq, sink.last_error) == (SinkState.CLOSED, 9, "")


def test_an_event_no_tracker_is_told_is_acknowledged_unread(job, bus, platform_redis_url,
                                                             caplog):
    """Per-op timings and expert loads are most of a run's stream: a sink passes them by on
    their entry's type, without parsing their JSON (an unparsable one here says it was not)."""
    stream = contract.events_stream(str(job.pk))
    bus.xadd(stream, contract.stream_entry("ops", "{not json"), id="1-0")
    publish_run(job, platform_redis_url, steps=[2])
    sink = Sink.objects.create(job=job, kind=SinkKind.TENSORBOARD)
    written = write_all(sink, bus)
    written.close(SinkState.CLOSED)
    assert bus.xpending(stream, consumer.group_of(sink.kind))["pending"] == 0
    assert "unreadable event" not in caplog.text
    sink.refresh_from_db()
    assert (sink.state, sink.last_seq, sink.last_error) == (SinkState.CLOSED, 2, "")
