"""The ingest: bus → database (exactly once) → the job's channel-layer group."""

import json

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from engine.runtime.events import EventLog, events_stream
from jobs.models import Checkpoint, Job
from monitor.ingest import GROUP, StreamIngest, job_group, step_metrics, store_events
from monitor.models import Action, Anomaly, Event, ExpertLoad, MetricPoint, OpsSample

pytestmark = pytest.mark.django_db(transaction=True)


def publish_steps(job, url, steps):
    log = EventLog(str(job.pk), bus_url=url)
    for step in steps:
        log.emit_wire("step", step, loss=6.0 / step, grad_norm=1.0, lr=1e-3, tokens_per_s=1e4,
                 step_time=0.1, tokens=1000 * step, memory={"rss_bytes": 2**30})
    log.close()


def test_step_events_are_stored_acknowledged_and_forwarded(job, bus, platform_redis_url):
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(job_group(job.pk), channel)
    publish_steps(job, platform_redis_url, range(1, 6))
    log = EventLog(str(job.pk), bus_url=platform_redis_url)
    log.emit_wire("log", 5, level="info", message="hi")

    ingest = StreamIngest(job.pk, bus)
    events = ingest.poll(block_ms=100)

    assert [(e.seq, e.type) for e in events] == [(1, "step"), (2, "step"), (3, "step"),
                                                 (4, "step"), (5, "step"), (6, "log")]
    assert list(Event.objects.filter(job=job).values_list("seq", "type")) == [
        (1, "step"), (2, "step"), (3, "step"), (4, "step"), (5, "step"), (6, "log")]
    losses = MetricPoint.objects.filter(job=job, name="loss").order_by("step")
    assert [(p.step, p.value) for p in losses] == [(s, 6.0 / s) for s in range(1, 6)]
    assert MetricPoint.objects.filter(job=job, name="memory.rss_bytes").count() == 5
    assert bus.xpending(events_stream(str(job.pk)), GROUP)["pending"] == 0
    job.refresh_from_db()
    assert job.step == 5
    async def receive_events(n):
        events = []
        while len(events) < n:  # forwarded in chunks, one channel-layer message each
            events += (await layer.receive(channel))["events"]
        return events

    forwarded = async_to_sync(receive_events)(6)
    assert [m["seq"] for m in forwarded] == [1, 2, 3, 4, 5, 6]
    assert forwarded[0]["type"] == "step" and forwarded[-1]["type"] == "log"
    assert ingest.poll(block_ms=50) == []


def test_events_delivered_but_not_acknowledged_are_stored_after_a_crash(job, bus,
                                                                        platform_redis_url):
    publish_steps(job, platform_redis_url, range(1, 4))
    first = StreamIngest(job.pk, bus, consumer="ingest-a")
    # a crash between reading and committing: delivered to ingest-a, never acknowledged
    bus.xreadgroup(GROUP, "ingest-a", {first.stream: ">"}, count=2)
    assert bus.xpending(first.stream, GROUP)["pending"] == 2

    restarted = StreamIngest(job.pk, bus, consumer="ingest-a")
    recovered = restarted.poll(block_ms=100)
    rest = restarted.poll(block_ms=100)
    assert [e.seq for e in recovered + rest] == [1, 2, 3]
    assert list(Event.objects.filter(job=job).values_list("seq", flat=True)) == [1, 2, 3]
    assert bus.xpending(first.stream, GROUP)["pending"] == 0


def test_a_redelivered_event_is_stored_once(job, bus, platform_redis_url):
    publish_steps(job, platform_redis_url, range(1, 4))
    StreamIngest(job.pk, bus, consumer="a").poll(block_ms=100)
    publish_steps(job, platform_redis_url, range(4, 6))
    # the group replays the whole stream: one batch of stored and new events, stored once each
    bus.xgroup_setid(events_stream(str(job.pk)), GROUP, id="0")
    assert len(StreamIngest(job.pk, bus, consumer="b").poll(block_ms=100)) == 5
    assert list(Event.objects.filter(job=job).values_list("seq", flat=True)) == [1, 2, 3, 4, 5]
    assert MetricPoint.objects.filter(job=job, name="loss").count() == 5


def test_after_an_outage_of_the_bus_what_the_ingest_had_read_is_stored_once_and_in_order(
        job, own_redis):
    """The poll that meets the outage fails; once the bus is back, the batch it held and the
    one it had read ahead are stored before anything newer, and acknowledged."""
    publish_steps(job, own_redis.url, [1, 2, 3, 2])  # step 2 trained again (a restart)
    bus = redis.Redis.from_url(own_redis.url)
    ingest = StreamIngest(job.pk, bus, consumer="a")
    assert [e.seq for e in ingest.poll(block_ms=100, count=2)] == [1, 2]  # 3, 4 read ahead
    own_redis.kill()
    with pytest.raises(redis.ConnectionError):
        ingest.poll(block_ms=100, count=2)
    own_redis.start()  # with its append-only file
    publish_steps(job, own_redis.url, [3])  # step 3 trained again, after the outage
    ingest.drain()
    assert list(Event.objects.filter(job=job).values_list("seq", flat=True)) == [1, 2, 3, 4, 5]
    loss = dict(MetricPoint.objects.filter(job=job, name="loss").values_list("step", "value"))
    assert loss == {1: 6.0, 2: 3.0, 3: 2.0}
    assert bus.xpending(ingest.stream, GROUP)["pending"] == 0
    bus.close()


def test_a_step_trained_again_replaces_its_earlier_values(job, bus, platform_redis_url):
    """After a crash restart (or a rollback) the engine trains steps again: the stored
    series keeps each step once, with the values of its latest run."""
    publish_steps(job, platform_redis_url, [1, 2, 3, 2, 3])  # restarted from step 1
    log = EventLog(str(job.pk), bus_url=platform_redis_url)
    log.emit_wire("step", 3, loss=0.25)  # and once more, in a later batch
    log.close()
    ingest = StreamIngest(job.pk, bus, consumer="a")
    ingest.poll(block_ms=100)
    ingest.poll(block_ms=100)
    loss = dict(MetricPoint.objects.filter(job=job, name="loss").values_list("step", "value"))
    assert loss == {1: 6.0, 2: 3.0, 3: 0.25}


def test_the_jobs_step_is_the_live_branchs_and_a_rollback_moves_it_back(job, bus,
                                                                         platform_redis_url):
    publish_steps(job, platform_redis_url, range(1, 9))
    ingest = StreamIngest(job.pk, bus, consumer="a")
    ingest.poll(block_ms=100)
    assert Job.objects.get(pk=job.pk).step == 8
    log = EventLog(str(job.pk), bus_url=platform_redis_url)
    log.emit_wire("action", 8, action="rollback", by="command", to_step=4, from_step=8)
    log.emit_wire("log", 8, level="info", message="rolled back")
    ingest.poll(block_ms=100)
    assert Job.objects.get(pk=job.pk).step == 4  # the list and the page show the live branch
    log.close()
    publish_steps(job, platform_redis_url, [5])
    ingest.poll(block_ms=100)
    assert Job.objects.get(pk=job.pk).step == 5

    # a batch stored again (the ingest died between its commit and its acknowledgement) does
    # not move the step back to where that batch left it
    store_events(job.pk, [e.data | {"seq": e.seq}
                          for e in Event.objects.filter(job=job, seq__lte=8)])
    assert Job.objects.get(pk=job.pk).step == 5


def test_step_metrics_flattens_numbers_and_marks_non_finite_values():
    event = {"type": "step", "job": "1", "step": 3, "time": 1.0, "seq": 9, "loss": "nan",
             "grad_norm": 2, "ok": True, "memory": {"rss_bytes": 10, "device": "cpu"}}
    assert step_metrics(event) == {"loss": None, "grad_norm": 2.0, "memory.rss_bytes": 10.0}


def test_per_rank_system_metrics_are_stored_as_one_series_per_rank(job, bus, platform_redis_url):
    """A step event's lists hold one value per rank (`system.cpu_percent: [a, b]`): each rank
    gets a series of its own; a value a rank did not measure (None) stores no point."""
    log = EventLog(str(job.pk), bus_url=platform_redis_url)
    for step in (1, 2):
        log.emit_wire("step", step, loss=1.0, system={
            "cpu_percent": [95.0 * step, 40.0], "rss_bytes": [2**30, 2**29 * step],
            "gpu_util_percent": [None, 50.0]})
    log.close()
    StreamIngest(job.pk, bus).poll(block_ms=100)

    stored = {}
    for name, step, value in MetricPoint.objects.filter(
            job=job, name__startswith="system.").values_list("name", "step", "value"):
        stored.setdefault(name, {})[step] = value
    assert stored == {
        "system.cpu_percent.rank0": {1: 95.0, 2: 190.0},
        "system.cpu_percent.rank1": {1: 40.0, 2: 40.0},
        "system.rss_bytes.rank0": {1: 2.0**30, 2: 2.0**30},
        "system.rss_bytes.rank1": {1: 2.0**29, 2: 2.0**30},
        "system.gpu_util_percent.rank1": {1: 50.0, 2: 50.0},
    }


def test_deleting_a_job_deletes_everything_stored_for_it(job):
    at = {"job": str(job.pk), "time": 1.0}
    store_events(job.pk, [
        {**at, "type": "step", "step": 1, "seq": 1, "loss": 3.0},
        {**at, "type": "ops", "step": 1, "seq": 2, "step_ms": 9.0, "void_share": 0.1,
         "data_wait_share": 0.0, "ops": {}, "ranks": []},
        {**at, "type": "experts", "step": 1, "seq": 3, "layers": [{"max_violation": 0.5}]},
        {**at, "type": "anomaly", "step": 1, "seq": 4, "kind": "loss_spike",
         "severity": "warning", "evidence": {}},
        {**at, "type": "action", "step": 1, "seq": 5, "action": "skip_update", "by": "policy"},
        {**at, "type": "checkpoint", "step": 1, "seq": 6, "path": "/c", "tier": "disk",
         "blocking_s": 0.1, "size_bytes": 10, "strategy": "NNN", "world_size": 1},
    ])
    models = (Event, MetricPoint, OpsSample, ExpertLoad, Anomaly, Action, Checkpoint)
    assert all(model.objects.filter(job_id=job.pk).exists() for model in models)
    job_id = job.pk
    job.delete()
    assert not any(model.objects.filter(job_id=job_id).exists() for model in models)


def test_an_event_of_an_unknown_type_is_stored_as_it_came_and_logged(job, bus, caplog):
    # from an engine newer than this platform (the engine's own EventLog refuses the type)
    at = {"job": str(job.pk), "step": 1, "time": 1.0}
    for seq, event in enumerate([{"type": "weather", "sky": "clear"},
                                 {"type": "log", "level": "info", "message": "after it"}], 1):
        bus.xadd(events_stream(str(job.pk)), {"event": json.dumps({**at, **event, "seq": seq})},
                 id=f"{seq}-0")

    events = StreamIngest(job.pk, bus).poll(block_ms=100)

    assert [(e.seq, e.type) for e in events] == [(2, "log")]  # only what the contract takes
    stored = Event.objects.get(job=job, seq=1)
    assert (stored.type, stored.data["sky"]) == ("weather", "clear")
    assert "unknown event type 'weather'" in caplog.text
    assert bus.xpending(events_stream(str(job.pk)), GROUP)["pending"] == 0


def test_a_malformed_event_is_stored_as_it_came_without_typed_rows_and_logged(
        job, bus, platform_redis_url, caplog):
    """The ingest goes on: the events after it are stored and typed as usual."""
    log = EventLog(str(job.pk), bus_url=platform_redis_url)
    log.emit_wire("anomaly", 2, kind="loss_spike", severity="warning", rank="three", evidence={})
    log.emit_wire("anomaly", 3, kind="nan_loss", severity="error", rank=1, evidence={})
    log.close()

    ingest = StreamIngest(job.pk, bus)
    assert [e.seq for e in ingest.poll(block_ms=100)] == [2]

    assert list(Event.objects.filter(job=job).values_list("seq", flat=True)) == [1, 2]
    assert Event.objects.get(job=job, seq=1).data["rank"] == "three"
    assert list(Anomaly.objects.filter(job=job).values_list("seq", "kind")) == [(2, "nan_loss")]
    assert "anomaly.rank: must be int or null, got str" in caplog.text
