"""monitor.pushes: what the job page would otherwise read from the API (commands, checkpoints,
live settings) comes over the job's socket, when it changes and as it is on (re)connecting."""

import pytest
import redis
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from engine.runtime.events import EventLog
from jobs.commands import issue
from jobs.models import Cause, CommandKind, Job
from monitor.ingest import StreamIngest
from ringside.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running(user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    job.start(supervisor="test")
    job.mark_running()
    return job


async def connected(job, user):
    """A socket on the job, past its snapshot; the pushed state that follows it, by type."""
    comm = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/",
                                 headers=[(b"origin", b"http://testserver"),
                                          (b"host", b"testserver")])
    comm.scope["user"] = user
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=5))["type"] == "snapshot"
    pushed = [await comm.receive_json_from(timeout=5) for _ in range(3)]
    return comm, {m["type"]: m for m in pushed}


async def next_of(comm, type):
    """The next message of a type (events and the goodput ledger come between)."""
    while (message := await comm.receive_json_from(timeout=5))["type"] != type:
        pass
    return message


def engine_says(job, platform_redis_url, *events):
    """The engine publishes `events` ((type, step, fields)); the ingest stores and forwards."""
    client = redis.Redis.from_url(platform_redis_url)
    log = EventLog(str(job.pk), bus_url=platform_redis_url)
    for type, step, fields in events:
        log.emit_wire(type, step, **fields)
    parsed = StreamIngest(job.pk, client).drain()
    client.close()
    return parsed


def checkpoint(step, tmp_path):
    return ("checkpoint", step, {"path": str(tmp_path / f"step-{step}"), "tier": "disk",
                                 "blocking_s": 0.1, "size_bytes": 10, "strategy": "NNN",
                                 "world_size": 1})


async def test_on_connecting_the_commands_checkpoints_and_settings_come_as_the_api_has_them(
        running, user, api):
    await database_sync_to_async(issue)(running, CommandKind.SET, {"train.lr": 0.01},
                                        actor="ada", cause=Cause.USER)
    comm, pushed = await connected(running, user)
    listed = await database_sync_to_async(api.get)(f"/api/jobs/{running.pk}/commands/")
    assert pushed["commands"]["commands"] == listed.json()["results"]
    assert pushed["checkpoints"]["checkpoints"] == []
    settings = await database_sync_to_async(api.get)(f"/api/jobs/{running.pk}/settings/")
    assert {k: pushed["settings"][k] for k in ("effective", "history")} == settings.json()
    await comm.disconnect()


async def test_every_move_of_a_commands_state_is_pushed_once_committed(
        running, user, platform_redis_url):
    comm, _ = await connected(running, user)
    command = await database_sync_to_async(issue)(running, CommandKind.SET, {"train.lr": 0.01},
                                                  actor="ada", cause=Cause.USER)
    moves = [await next_of(comm, "command") for _ in range(2)]
    assert [(m["command"]["id"], m["command"]["state"]) for m in moves] == [
        (command.pk, "pending"), (command.pk, "delivered")]

    def engine_answers():
        from jobs.commands import settle

        [event] = engine_says(running, platform_redis_url, ("action", 3, {
            "action": "set", "by": "ada", "command": str(command.pk),
            "changes": {"train.lr": {"old": 0.001, "new": 0.01}}}))
        settle(running, event)  # what the supervisor does with it

    await database_sync_to_async(engine_answers)()
    settings = await next_of(comm, "settings")
    assert settings["effective"]["train.lr"] == 0.01
    done = await next_of(comm, "command")
    assert (done["command"]["state"], done["command"]["result"]["changes"]) == (
        "done", {"train.lr": {"old": 0.001, "new": 0.01}})
    await comm.disconnect()


async def test_a_checkpoint_and_a_rollback_push_the_list_with_ids_and_branches(
        running, user, platform_redis_url, tmp_path):
    comm, _ = await connected(running, user)
    await database_sync_to_async(engine_says)(running, platform_redis_url,
                                              checkpoint(2, tmp_path), checkpoint(4, tmp_path))
    saved = await next_of(comm, "checkpoints")
    assert [(c["step"], c["branch"]) for c in saved["checkpoints"]] == [(2, "live"), (4, "live")]
    assert all(isinstance(c["id"], int) for c in saved["checkpoints"])
    await database_sync_to_async(engine_says)(running, platform_redis_url, ("action", 4, {
        "action": "rollback", "by": "ada", "from_step": 4, "to_step": 2,
        "checkpoint": str(tmp_path / "step-2"), "settings": "restored"}))
    rolled = await next_of(comm, "checkpoints")
    assert [(c["step"], c["branch"]) for c in rolled["checkpoints"]] == [
        (2, "live"), (4, "abandoned")]
    settings = await next_of(comm, "settings")
    assert settings["history"][-1]["by"] == "rollback"
    await comm.disconnect()
