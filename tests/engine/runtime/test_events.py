"""The event log: JSONL and the Redis stream, sequence numbers that survive restarts."""

import json
import math
import threading

import redis

from engine.contract import ActionEvent, parse_event
from engine.runtime import events as events_module
from engine.runtime.events import EventLog, events_stream, read_events


def test_events_carry_the_contract_fields_and_continue_their_sequence(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog("job-1", path)
    log.emit_wire("state", 0, state="running")
    log.emit_wire("step", 1, loss=3.5, grad_norm=float("nan"))
    log.close()
    log = EventLog("job-1", path)  # a restarted engine
    log.emit_wire("step", 2, loss=3.0)
    log.close()

    events = read_events(path)
    assert [e["seq"] for e in events] == [1, 2, 3]
    assert all({"type", "job", "step", "time", "seq"} <= e.keys() for e in events)
    assert events[1]["grad_norm"] == "nan"  # JSON has no NaN; the value stays visible


def test_a_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog("j", path)
    log.emit_wire("log", 0, level="info", message="hello")
    log.close()
    with path.open("a") as f:
        f.write('{"type": "step", "se')
    assert EventLog("j", path).seq == 1


def test_bus_entries_are_numbered_by_sequence(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    job = "test-events-bus"
    client.delete(events_stream(job))
    try:
        log = EventLog(job, bus_url=redis_url)
        log.emit_wire("state", 0, state="running")
        log.emit_wire("step", 1, loss=math.pi)
        log.close()
        assert EventLog(job, bus_url=redis_url).seq == 2
        entries = client.xrange(events_stream(job))
        assert [e[0] for e in entries] == [b"1-0", b"2-0"]
        assert json.loads(entries[1][1][b"event"])["loss"] == math.pi
    finally:
        client.delete(events_stream(job))


def _stream_steps(url: str, job: str) -> list[tuple[bytes, int]]:
    entries = redis.Redis.from_url(url).xrange(events_stream(job))
    return [(entry_id, json.loads(fields[b"event"])["step"]) for entry_id, fields in entries]


def test_a_run_outlives_an_outage_of_the_bus_which_then_gets_every_event_in_order(
        own_redis, tmp_path, monkeypatch):
    monkeypatch.setattr(events_module, "BUS_RETRY_S", 0.0)
    log = EventLog("outage", tmp_path / "events.jsonl", own_redis.url)
    log.emit_wire("step", 1, loss=3.0)
    own_redis.kill()
    for step in (2, 3, 4):
        log.emit_wire("step", step, loss=3.0 - step / 10)  # the bus is away: training goes on
    own_redis.start()  # with its append-only file
    log.emit_wire("step", 5, loss=2.4)
    log.close()
    assert _stream_steps(own_redis.url, "outage") == [
        (b"1-0", 1), (b"2-0", 2), (b"3-0", 3), (b"4-0", 4), (b"5-0", 5)]
    assert [e["step"] for e in read_events(tmp_path / "events.jsonl")] == [1, 2, 3, 4, 5]


def test_closing_the_log_waits_for_the_bus_to_take_what_it_missed(own_redis, monkeypatch):
    monkeypatch.setattr(events_module, "BUS_RETRY_S", 0.05)
    log = EventLog("closing", bus_url=own_redis.url)
    log.emit_wire("step", 1)
    own_redis.kill()
    log.emit_wire("state", 1, state="completed")
    back = threading.Timer(0.5, own_redis.start)
    back.start()
    log.close()
    back.join()
    assert _stream_steps(own_redis.url, "closing") == [(b"1-0", 1), (b"2-0", 1)]


def test_a_typed_event_is_stamped_and_written_in_its_wire_form(tmp_path):
    log = EventLog("job-2", tmp_path / "events.jsonl")
    wire = log.emit(ActionEvent(step=4, action="lr_cut", by="policy", details={"lr_factor": 0.1}))
    log.close()
    (written,) = read_events(tmp_path / "events.jsonl")
    assert written == wire
    assert list(wire)[:5] == ["type", "job", "step", "time", "seq"]
    assert (wire["job"], wire["seq"], wire["lr_factor"]) == ("job-2", 1, 0.1)
    assert parse_event(wire) == ActionEvent(step=4, job="job-2", time=wire["time"], seq=1,
                                            action="lr_cut", by="policy",
                                            details={"lr_factor": 0.1})
