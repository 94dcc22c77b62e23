"""Websocket /ws/jobs/<id>/: who may watch, the snapshot, then live events in order."""

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from engine.runtime.events import EventLog
from jobs.models import ApiToken
from monitor.ingest import StreamIngest, store_events
from ringside.asgi import application
from tests.platform.sockets import refusal

pytestmark = pytest.mark.django_db(transaction=True)


def communicator(job, query="", user=None):
    comm = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/{query}",
                                 headers=[(b"origin", b"http://testserver"),
                                          (b"host", b"testserver")])
    if user is not None:
        comm.scope["user"] = user
    return comm


async def test_anonymous_clients_are_refused(job):
    connected, code = await refusal(communicator(job, user=AnonymousUser()))
    assert (connected, code) == (False, 4401)


async def test_only_the_owner_may_watch_a_job(job, other_user):
    connected, code = await refusal(communicator(job, user=other_user))
    assert (connected, code) == (False, 4404)
    stranger_token = await database_sync_to_async(ApiToken.objects.create)(user=other_user,
                                                                           name="ws")
    connected, code = await refusal(communicator(job, f"?token={stranger_token.key}"))
    assert (connected, code) == (False, 4404)
    connected, code = await refusal(communicator(job, "?token=" + "f" * 40))
    assert (connected, code) == (False, 4401)


async def test_the_owner_gets_a_snapshot_then_live_step_events_in_order(
        job, user, bus, platform_redis_url):
    await database_sync_to_async(store_events)(job.pk, [
        {"type": "step", "job": str(job.pk), "step": 1, "time": 1.0, "seq": 1, "loss": 5.5,
         "tokens_per_s": 900.0}])
    token = await database_sync_to_async(ApiToken.objects.create)(user=user, name="ws")
    comm = communicator(job, f"?token={token.key}")
    connected, _ = await comm.connect()
    assert connected
    snapshot = await comm.receive_json_from(timeout=5)
    assert snapshot["type"] == "snapshot" and snapshot["seq"] == 1
    assert snapshot["job"]["state"] == "queued" and snapshot["job"]["total_steps"] == 6
    assert snapshot["series"]["loss"] == {"step": [1], "value": [5.5], "min": [5.5], "max": [5.5]}
    # then what is pushed rather than stored, as it is now (monitor.pushes)
    assert [(await comm.receive_json_from(timeout=5))["type"] for _ in range(3)] == [
        "commands", "checkpoints", "settings"]

    def publish_and_ingest():
        # the engine's side (EventLog on the bus) and the supervisor's side (the ingest)
        log = EventLog(str(job.pk), bus_url=platform_redis_url)
        log.seq = 1  # stream is empty: the stored event above came through store_events
        for step in (2, 3, 4):
            log.emit_wire("step", step, loss=5.0 / step, tokens_per_s=1000.0)
        StreamIngest(job.pk, bus).drain()

    await database_sync_to_async(publish_and_ingest)()
    live = [await comm.receive_json_from(timeout=5) for _ in range(4)]
    assert [(m["type"], m["seq"], m["step"]) for m in live[:3]] == [
        ("step", 2, 2), ("step", 3, 3), ("step", 4, 4)]
    assert live[0]["loss"] == 2.5
    # after the batch, the goodput ledger it brought up to date
    assert (live[3]["type"], live[3]["seq"], live[3]["goodput"]["job"]) == ("goodput", 4, job.pk)
    assert await comm.receive_nothing(timeout=0.3)  # nothing twice, nothing from the snapshot
    await comm.disconnect()


async def test_staff_may_watch_any_job_with_their_session(job, django_user_model):
    staff = await database_sync_to_async(django_user_model.objects.create_user)(
        "root", password="pw", is_staff=True)
    comm = communicator(job, user=staff)
    connected, _ = await comm.connect()
    assert connected
    assert (await comm.receive_json_from(timeout=5))["type"] == "snapshot"
    await comm.disconnect()


async def test_a_client_reconnecting_after_a_seq_gets_what_it_missed_then_the_job_state(
        job, user):
    await database_sync_to_async(store_events)(job.pk, [
        {"type": "step", "job": str(job.pk), "step": s, "time": 1.0, "seq": s, "loss": 6.0 - s}
        for s in (1, 2, 3)])
    comm = communicator(job, "?after=1", user=user)
    connected, _ = await comm.connect()
    assert connected
    replay = [await comm.receive_json_from(timeout=5) for _ in range(7)]
    assert [(m["type"], m["seq"]) for m in replay] == [
        ("step", 2), ("step", 3), ("job", 3), ("goodput", 3), ("commands", 3),
        ("checkpoints", 3), ("settings", 3)]
    # a state change pushed while the client was away is not an event: it comes as the state,
    # and so do the goodput ledger, the commands, the checkpoints and the settings
    assert replay[2]["state"] == job.state
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_a_bad_after_is_answered_with_an_error_naming_it(job, user):
    comm = communicator(job, "?after=yesterday", user=user)
    connected, _ = await comm.connect()
    assert connected
    message = await comm.receive_json_from(timeout=5)
    assert message["type"] == "error" and message["error"].startswith("after:")
    assert (await comm.receive_output(timeout=5))["code"] == 4400
    await comm.disconnect()
