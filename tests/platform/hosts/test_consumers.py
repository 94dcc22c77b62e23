"""`/ws/hosts/`: a snapshot of every host (with the server's clock and HOST_LOST_AFTER_S),
then the record of each host announced as changed (hosts.live.publish: a beat, a drain);
anonymous sockets are closed with 4401."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from hosts import live, registry
from hosts.models import Host
from ringside.asgi import application
from tests.platform.sockets import refusal

pytestmark = pytest.mark.django_db(transaction=True)


def socket(user) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(application, "/ws/hosts/",
                                 headers=[(b"origin", b"http://testserver"),
                                          (b"host", b"testserver")])
    comm.scope["user"] = user
    return comm


def make_host(name: str, beat_s_ago: float = 0) -> Host:
    return Host.objects.create(name=name, address="10.0.0.1", slots=8, instance="x",
                               devices={"cpu": {"cores": 2, "memory_bytes": 2**30}, "gpus": []},
                               beat_at=timezone.now() - timedelta(seconds=beat_s_ago))


async def test_the_snapshot_then_each_changed_host(user, settings):
    settings.HOST_LOST_AFTER_S = 12.0
    await database_sync_to_async(make_host)("a")
    b = await database_sync_to_async(make_host)("b", beat_s_ago=60)
    comm = socket(user)
    assert (await comm.connect())[0]
    snap = await comm.receive_json_from(timeout=5)
    assert snap["type"] == "snapshot" and snap["lost_after_s"] == 12.0 and snap["now"]
    # (the session's worker host may be registered too)
    assert [(h["name"], h["state"], h["slots_free"]) for h in snap["hosts"]
            if h["name"] in ("a", "b")] == [("a", "up", 8), ("b", "lost", 8)]

    await database_sync_to_async(registry.beat)(b)  # b is back; its worker announces it
    await database_sync_to_async(live.publish)("b")
    change = await next_about(comm, ("a", "b"))
    assert change["type"] == "host" and change["host"]["name"] == "b"
    assert change["host"]["state"] == "up" and change["host"]["beat_age_s"] < 5
    await database_sync_to_async(live.publish)("gone")  # no such host: nothing to send
    await database_sync_to_async(live.publish)("a")
    assert (await next_about(comm, ("a", "b", "gone")))["host"]["name"] == "a"
    await comm.disconnect()


async def next_about(comm, names: tuple[str, ...]) -> dict:
    """The next message about one of `names` (the session's worker host, if running, beats
    and is announced too)."""
    while True:
        message = await comm.receive_json_from(timeout=5)
        if message["host"]["name"] in names:
            return message


async def test_anonymous_sockets_are_refused():
    assert await refusal(socket(AnonymousUser())) == (False, 4401)


async def test_another_users_job_is_anonymous_on_the_socket(user, other_user):
    def hold() -> int:
        from jobs.models import Job, Reservation

        a = make_host("a")
        theirs = Job.objects.create(name="secret-name", owner=other_user, spec={"name": "s"})
        Reservation.objects.create(job=theirs, host=a, incarnation=1, node_rank=0, slots=[0])
        return theirs.pk

    theirs = await database_sync_to_async(hold)()
    comm = socket(user)
    assert (await comm.connect())[0]
    snap = await comm.receive_json_from(timeout=5)
    [a] = [h for h in snap["hosts"] if h["name"] == "a"]
    assert a["jobs"] == [{"job": None, "name": "a job of another user", "node_rank": 0,
                          "slots": [0]}]
    await database_sync_to_async(live.publish)("a")
    change = await next_about(comm, ("a",))
    assert change["host"]["jobs"][0]["job"] is None
    assert "secret-name" not in str(change) and str(theirs) not in str(change["host"]["jobs"])
    await comm.disconnect()
