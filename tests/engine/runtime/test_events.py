"""The event log: JSONL and the Redis stream, sequence numbers that survive restarts."""

import json
import math

from engine.runtime.events import EventLog, events_stream, read_events


def test_events_carry_the_contract_fields_and_continue_their_sequence(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog("job-1", path)
    log.emit("state", 0, state="running")
    log.emit("step", 1, loss=3.5, grad_norm=float("nan"))
    log.close()
    log = EventLog("job-1", path)  # a restarted engine
    log.emit("step", 2, loss=3.0)
    log.close()

    events = read_events(path)
    assert [e["seq"] for e in events] == [1, 2, 3]
    assert all({"type", "job", "step", "time", "seq"} <= e.keys() for e in events)
    assert events[1]["grad_norm"] == "nan"  # JSON has no NaN; the value stays visible


def test_a_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog("j", path)
    log.emit("log", 0, level="info", message="hello")
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
        log.emit("state", 0, state="running")
        log.emit("step", 1, loss=math.pi)
        log.close()
        assert EventLog(job, bus_url=redis_url).seq == 2
        entries = client.xrange(events_stream(job))
        assert [e[0] for e in entries] == [b"1-0", b"2-0"]
        assert json.loads(entries[1][1][b"event"])["loss"] == math.pi
    finally:
        client.delete(events_stream(job))
