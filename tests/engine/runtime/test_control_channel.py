"""The control channel's two transports: the job's Redis stream and the run's control file."""

import redis

from engine.contract import CommandKind
from engine.runtime import events
from engine.runtime.control import Command, ControlChannel, send
from engine.runtime.events import control_stream


def test_commands_on_the_bus_arrive_once_in_order(redis_url, tmp_path):
    job = "test-control-bus"
    client = redis.Redis.from_url(redis_url)
    client.delete(control_stream(job))
    try:
        send(job, "checkpoint", bus_url=redis_url)  # sent before the engine started: not ours
        channel = ControlChannel(job, tmp_path, bus_url=redis_url)
        assert channel.poll() == []
        send(job, "rollback", {"step": 20, "skip_data": True}, bus_url=redis_url,
             command_id="c-7")
        send(job, "pause", bus_url=redis_url)
        first, second = channel.poll()
        assert (first.id, first.kind, first.args) == ("c-7", "rollback",
                                                      {"step": 20, "skip_data": True})
        assert second.kind == "pause" and second.id  # the stream entry id when none is given
        assert channel.poll() == []
        channel.close()
    finally:
        client.delete(control_stream(job))


def test_commands_wait_in_the_stream_while_the_bus_is_away(own_redis, tmp_path, monkeypatch):
    monkeypatch.setattr(events, "BUS_RETRY_S", 0.0)
    channel = ControlChannel("job", tmp_path, bus_url=own_redis.url)
    send("job", "checkpoint", bus_url=own_redis.url)
    own_redis.kill()
    assert channel.poll() == []  # the step goes on
    own_redis.start()  # with its append-only file
    send("job", "pause", bus_url=own_redis.url)
    assert [c.kind for c in channel.poll()] == ["checkpoint", "pause"]
    channel.close()


def test_a_command_delivered_twice_is_read_once(redis_url, tmp_path):
    job = "test-control-twice"
    client = redis.Redis.from_url(redis_url)
    client.delete(control_stream(job))
    try:
        channel = ControlChannel(job, tmp_path, bus_url=redis_url)
        send(job, "checkpoint", bus_url=redis_url, command_id="41")
        send(job, "checkpoint", bus_url=redis_url, command_id="41")  # delivered again
        send(job, "pause", bus_url=redis_url, command_id="42")
        assert [(c.id, c.kind) for c in channel.poll()] == [("41", "checkpoint"), ("42", "pause")]
        send(job, "pause", bus_url=redis_url, command_id="42")
        assert channel.poll() == []
        channel.close()
    finally:
        client.delete(control_stream(job))


def test_the_control_file_reads_only_complete_new_lines(tmp_path):
    (tmp_path / "control.jsonl").write_text('{"kind": "pause"}\n')  # an earlier run's
    channel = ControlChannel("job", tmp_path)
    send("job", "checkpoint", run_dir=tmp_path)
    with (tmp_path / "control.jsonl").open("a") as f:
        f.write('{"kind": "reshard", "args": {"nodes"')  # still being written
    assert [c.kind for c in channel.poll()] == ["checkpoint"]
    with (tmp_path / "control.jsonl").open("a") as f:
        f.write(': 1}}\n{"kind": "launch"}\nnot json\n')
    (reshard,) = channel.poll()
    assert reshard == Command(id=reshard.id, kind="reshard", args={"nodes": 1})
    assert channel.errors == [
        "command: not JSON: 'not json'",
        f"command.kind: must be one of {', '.join(CommandKind)}",
    ]
