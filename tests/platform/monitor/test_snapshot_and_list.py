"""The job socket's snapshot holds everything a page draws; live events lost on the way are
read back from the database; the list socket pushes the state changes of the user's jobs."""

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from jobs.models import Cause, Job
from monitor.ingest import forward, store_events
from ringside.asgi import application
from tests.platform.sockets import refusal

pytestmark = pytest.mark.django_db(transaction=True)


def socket(path, user):
    comm = WebsocketCommunicator(application, path, headers=[(b"origin", b"http://testserver"),
                                                             (b"host", b"testserver")])
    comm.scope["user"] = user
    return comm


async def snapshot_of(comm):
    """The snapshot, past the pushed state that follows it (commands, checkpoints, settings)."""
    snapshot = await comm.receive_json_from(timeout=5)
    pushed = [(await comm.receive_json_from(timeout=5))["type"] for _ in range(3)]
    assert pushed == ["commands", "checkpoints", "settings"]
    return snapshot


def event(job, seq, type, step, **fields):
    return {"type": type, "job": str(job.pk), "step": step, "time": 1.0, "seq": seq, **fields}


def run_history(job):
    return [
        event(job, 1, "state", 0, state="running"),
        event(job, 2, "step", 1, loss=5.0, tokens_per_s=100.0),
        event(job, 3, "ops", 1, step_ms=12.0, void_share=0.1, data_wait_share=0.0, ranks=[],
              ops={"forward": {"kind": "compute", "total_ms": 9.0,
                               "per_rank_ms": [9.0, 4.0]}}),
        event(job, 4, "experts", 1, layers=[{"tokens_per_expert": [3, 1], "max_violation": 0.5,
                                             "dead_experts": 0}]),
        event(job, 5, "anomaly", 1, kind="straggler", severity="warning", rank=0,
              evidence={"ratio": 2.2}),
        event(job, 6, "action", 1, action="observe", by="policy", anomaly="straggler"),
        event(job, 7, "checkpoint", 1, path="/runs/1/step-1", tier="disk", size_bytes=10,
              strategy="NNN", world_size=2, blocking_s=0.1),
        event(job, 8, "step", 2, loss=4.0, tokens_per_s=110.0),
    ]


async def test_the_snapshot_holds_series_feeds_latest_samples_state_and_spec(job, user):
    await database_sync_to_async(store_events)(job.pk, run_history(job))
    comm = socket(f"/ws/jobs/{job.pk}/", user)
    assert (await comm.connect())[0]
    snap = await snapshot_of(comm)
    assert snap["type"] == "snapshot" and snap["seq"] == snap["last_seq"] == 8
    assert snap["state"] == "queued" and snap["spec"] == job.spec
    assert snap["series"]["loss"]["step"] == [1, 2]
    assert snap["series"]["loss"]["max"] == [5.0, 4.0]
    assert snap["ops"]["step"] == 1 and snap["ops"]["ops"]["forward"]["per_rank_ms"] == [9.0, 4.0]
    assert snap["experts"]["layers"][0]["tokens_per_expert"] == [3, 1]
    assert [a["kind"] for a in snap["anomalies"]] == ["straggler"]
    assert [(a["action"], a["seq"]) for a in snap["actions"]] == [("observe", 6)]
    assert [c["path"] for c in snap["checkpoints"]] == ["/runs/1/step-1"]
    await comm.disconnect()


async def test_live_events_dropped_on_the_way_are_read_back_in_order(job, user):
    history = run_history(job)
    await database_sync_to_async(store_events)(job.pk, history[:2])
    comm = socket(f"/ws/jobs/{job.pk}/", user)
    assert (await comm.connect())[0]
    assert (await snapshot_of(comm))["seq"] == 2
    # stored, but only the last one reaches this client (the channel layer shed the others)
    await database_sync_to_async(store_events)(job.pk, history[2:])
    await database_sync_to_async(forward)(job.pk, history[-1:])
    received = [await comm.receive_json_from(timeout=5) for _ in range(6)]
    assert [m["seq"] for m in received] == [3, 4, 5, 6, 7, 8]
    assert received[2]["type"] == "anomaly" and received[5]["loss"] == 4.0
    # a late duplicate of something already sent is not sent twice
    await database_sync_to_async(forward)(job.pk, history[3:5])
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_the_job_socket_hears_every_state_change_with_its_cause(job, user):
    comm = socket(f"/ws/jobs/{job.pk}/", user)
    assert (await comm.connect())[0]
    await snapshot_of(comm)
    await database_sync_to_async(job.request_cancel)(Cause.USER, "ada")
    change = await comm.receive_json_from(timeout=5)
    assert (change["type"], change["state"], change["from_state"], change["cause"],
            change["actor"]) == ("job", "cancelled", "queued", "user", "ada")
    await comm.disconnect()


async def test_the_list_socket_pushes_state_changes_of_the_users_jobs_only(
        job, user, other_user, django_user_model):
    theirs = await database_sync_to_async(Job.objects.create)(name="theirs", owner=other_user,
                                                              spec=job.spec)
    mine = socket("/ws/jobs/", user)
    assert (await mine.connect())[0]
    snap = await mine.receive_json_from(timeout=5)
    assert snap["type"] == "snapshot" and [j["id"] for j in snap["jobs"]] == [job.pk]
    staff = await database_sync_to_async(django_user_model.objects.create_user)(
        "root", password="pw", is_staff=True)
    everyone = socket("/ws/jobs/", staff)
    assert (await everyone.connect())[0]
    assert {j["id"] for j in (await everyone.receive_json_from(timeout=5))["jobs"]} == {
        job.pk, theirs.pk}

    await database_sync_to_async(theirs.request_cancel)(Cause.USER, "bob")
    await database_sync_to_async(job.request_cancel)(Cause.API_TOKEN, "ada")
    change = await mine.receive_json_from(timeout=5)
    assert (change["type"], change["job"], change["state"]) == ("job", job.pk, "cancelled")
    assert change["seq"] > snap["seq"]
    assert await mine.receive_nothing(timeout=0.3)  # not bob's job
    seen = [await everyone.receive_json_from(timeout=5) for _ in range(2)]
    assert [m["job"] for m in seen] == [theirs.pk, job.pk]
    await mine.disconnect()
    await everyone.disconnect()


async def test_the_list_socket_refuses_anonymous_clients():
    from django.contrib.auth.models import AnonymousUser

    assert await refusal(socket("/ws/jobs/", AnonymousUser())) == (False, 4401)


async def test_an_idle_list_socket_outlives_the_channel_layers_blocking_read(job, user):
    comm = socket("/ws/jobs/", user)
    assert (await comm.connect())[0]
    await comm.receive_json_from(timeout=5)
    # longer than a blocking pop on Redis (5 s): neither a close (1011) nor anything else
    assert await comm.receive_nothing(timeout=6.5, interval=0.1)
    await database_sync_to_async(job.request_cancel)(Cause.USER, "ada")
    change = await comm.receive_json_from(timeout=5)
    assert (change["type"], change["state"]) == ("job", "cancelled")
    await comm.disconnect()
