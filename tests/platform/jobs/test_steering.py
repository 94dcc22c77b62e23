"""Steering through the API: each command is stored, moves the job through its model methods,
lands on the engine's control stream with its id, and is settled by the engine's answer."""

import json

import pytest
import redis
from django.utils import timezone
from rest_framework.test import APIClient

from engine.contract import parse_event
from engine.runtime.events import control_stream
from jobs.commands import deliver_pending
from jobs.models import Checkpoint, Command, Job, State
from jobs.tasks import Supervisor
from tests.platform.services import stored_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


def control_commands(job: Job) -> list[dict]:
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    entries = client.xrange(control_stream(str(job.pk)))
    client.close()
    return [json.loads(fields[b"command"]) for _, fields in entries]


def answer(job: Job, **event) -> None:
    """Hand the supervisor's event handler an engine event, as the ingest would."""
    supervisor = Supervisor(job, proc=None, ingest=None, me="test")
    supervisor.on_event(parse_event({"type": "action", "job": str(job.pk), "step": 3,
                                     "time": 0.0, "seq": 99, **event}))


def test_pause_moves_the_job_records_who_and_delivers_the_command_with_its_id(api, running):
    response = api.post(f"/api/jobs/{running.pk}/pause/", {}, format="json")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert set(body) == {"id", "kind", "args", "state", "result", "requested_by", "created_at",
                         "updated_at"}
    assert (body["kind"], body["state"], body["requested_by"]) == ("pause", "delivered", "ada")
    running.refresh_from_db()
    assert running.state == State.PAUSING
    last = running.transitions.last()
    assert (last.from_state, last.to_state, last.cause, last.actor) == (
        "running", "pausing", "api_token", "ada")
    assert control_commands(running) == [{"kind": "pause", "args": {}, "id": str(body["id"])}]

    answer(running, action="pause", command=str(body["id"]), by="command", path="/ck/3")
    command = Command.objects.get(pk=body["id"])
    assert command.state == "done" and command.result["path"] == "/ck/3"
    listed = api.get(f"/api/jobs/{running.pk}/commands/").json()["results"]
    assert [(c["id"], c["state"]) for c in listed] == [(body["id"], "done")]


def test_a_command_issued_while_the_bus_is_away_is_delivered_once_it_is_back(
        api, running, own_redis, settings):
    """The API answers at once (the command is stored and pending, the job pausing); the
    job's supervisor delivers it when the bus is back."""
    settings.REDIS_URL = own_redis.url
    issued_from = timezone.now()
    own_redis.kill()
    response = api.post(f"/api/jobs/{running.pk}/rollback/", {"step": 2}, format="json")
    assert response.status_code == 202, response.json()
    assert response.json()["state"] == "pending"
    running.refresh_from_db()
    assert running.state == State.ROLLING_BACK

    own_redis.start()
    deliver_pending(running, since=issued_from, older_than=timezone.now())
    command = Command.objects.get(pk=response.json()["id"])
    assert command.state == "delivered"
    assert control_commands(running) == [
        {"kind": "rollback", "args": {"step": 2, "skip_data": False}, "id": str(command.pk)}]
    deliver_pending(running, since=issued_from, older_than=timezone.now())  # nothing left
    assert len(control_commands(running)) == 1


def test_a_refused_rollback_is_settled_with_the_reason_and_the_job_runs_on(api, running):
    body = api.post(f"/api/jobs/{running.pk}/rollback/", {"step": 2, "skip_data": True},
                    format="json").json()
    running.refresh_from_db()
    assert running.state == State.ROLLING_BACK and body["args"] == {"step": 2, "skip_data": True}
    answer(running, action="refused", command=str(body["id"]), kind="rollback",
           error="rollback: no good checkpoint matches 2")
    command = Command.objects.get(pk=body["id"])
    assert command.state == "refused" and "no good checkpoint" in command.result["error"]
    running.refresh_from_db()
    assert running.state == State.RUNNING
    assert "refused" in running.transitions.last().message


def test_a_done_rollback_returns_the_job_to_running(api, running, tmp_path):
    path = stored_checkpoint(tmp_path / "step-2")
    ckpt = Checkpoint.objects.create(job=running, seq=5, step=2, time=0.0, path=path,
                                     tier="disk")
    body = api.post(f"/api/jobs/{running.pk}/rollback/", {"checkpoint": ckpt.pk},
                    format="json").json()
    # the engine gets the checkpoint by path; the command keeps the id the user gave
    assert control_commands(running)[-1]["args"] == {"checkpoint": path, "skip_data": False}
    answer(running, action="rollback", command=str(body["id"]), by="command", from_step=4,
           to_step=2, checkpoint=path)
    running.refresh_from_db()
    assert running.state == State.RUNNING
    assert "rolled back from step 4 to step 2" in running.transitions.last().message


def test_checkpoints_deleted_by_retention_are_listed_as_unavailable_and_refused(
        api, running, tmp_path):
    kept = Checkpoint.objects.create(job=running, seq=9, step=4, time=0.0, tier="disk",
                                     path=stored_checkpoint(tmp_path / "step-4"))
    pruned = Checkpoint.objects.create(job=running, seq=5, step=2, time=0.0, tier="disk",
                                       path=str(tmp_path / "step-2"))
    listed = api.get(f"/api/jobs/{running.pk}/checkpoints/").json()["results"]
    assert [(c["id"], c["available"]) for c in listed] == [(pruned.pk, False), (kept.pk, True)]
    for kind in ("rollback", "clone"):
        response = api.post(f"/api/jobs/{running.pk}/{kind}/", {"checkpoint": pruned.pk},
                            format="json")
        assert response.status_code == 400, kind
        assert "deleted by the job's retention" in " ".join(response.json()["checkpoint"])
    assert not Command.objects.exists()


@pytest.mark.parametrize("body, field, message", [
    ({}, "checkpoint", "exactly one of checkpoint and step"),
    ({"step": 1, "checkpoint": 1}, "checkpoint", "exactly one"),
    ({"step": -1}, "step", "greater than or equal to 0"),
    ({"checkpoint": 12345}, "checkpoint", "has no checkpoint 12345"),
    ({"step": 1, "skip_data": "maybe"}, "skip_data", "valid boolean"),
])
def test_a_bad_rollback_body_gets_400_naming_the_field(api, running, body, field, message):
    response = api.post(f"/api/jobs/{running.pk}/rollback/", body, format="json")
    assert response.status_code == 400
    assert message in " ".join(response.json()[field])
    assert not Command.objects.exists()
    running.refresh_from_db()
    assert running.state == State.RUNNING


@pytest.mark.parametrize("body, field", [
    ({"strategy": "XYZ", "nodes": 1, "procs_per_node": 2}, "strategy"),
    ({"strategy": "NNN", "nodes": 0, "procs_per_node": 2}, "nodes"),
    ({"strategy": "NNN", "nodes": 1}, "procs_per_node"),
    ({"strategy": "NNN", "nodes": 1, "procs_per_node": 3}, "nodes"),  # 2 sequences over 3
])
def test_a_bad_reshard_body_gets_400_naming_the_field(api, running, body, field):
    response = api.post(f"/api/jobs/{running.pk}/reshard/", body, format="json")
    assert response.status_code == 400 and field in response.json(), response.json()


def test_reshard_is_delivered_and_the_engine_resuming_on_the_layout_ends_it(api, running):
    body = api.post(f"/api/jobs/{running.pk}/reshard/",
                    {"strategy": "NGG", "nodes": 1, "procs_per_node": 2}, format="json").json()
    running.refresh_from_db()
    assert running.state == State.RESHARDING
    supervisor = Supervisor(running, proc=None, ingest=None, me="test")
    answer(running, action="reshard", command=str(body["id"]), by="command")
    state = {"type": "state", "job": str(running.pk), "step": 3, "time": 0.0}
    supervisor.on_event(parse_event({
        **state, "seq": 100, "state": "resharding", "micro_batch": 1,
        "parallel": {"nodes": 1, "procs_per_node": 2, "strategy": "NGG", "collective": "native"}}))
    supervisor.on_event(parse_event({**state, "seq": 101, "state": "running"}))
    running.refresh_from_db()
    assert running.state == State.RUNNING
    assert running.spec["parallel"]["strategy"] == "NGG"
    assert running.spec["train"]["micro_batch"] == 1


def test_a_reshard_is_judged_at_the_engines_default_micro_batch(api, user, small_spec):
    """A spec that leaves micro_batch out trains at the engine's default (8): two ranks hold a
    global micro-batch of 16, which divides over 4 ranks and not over 3."""
    train = {k: v for k, v in small_spec["train"].items() if k != "micro_batch"}
    job = Job.objects.create(name="t", owner=user, spec={**small_spec, "train": train,
                                                          "parallel": {"procs_per_node": 2}})
    job.start(supervisor="test")
    job.mark_running()
    refused = api.post(f"/api/jobs/{job.pk}/reshard/",
                       {"strategy": "NNN", "nodes": 1, "procs_per_node": 3}, format="json")
    assert refused.status_code == 400
    assert "global micro-batch (8 x 2 sequences)" in refused.json()["nodes"][0]
    taken = api.post(f"/api/jobs/{job.pk}/reshard/",
                     {"strategy": "NNN", "nodes": 1, "procs_per_node": 4}, format="json")
    assert taken.status_code == 202, taken.json()


def test_reshard_to_fewer_ranks_drops_the_faults_injected_on_ranks_that_go_away(
        api, user, small_spec):
    spec = {**small_spec, "parallel": {"nodes": 2, "procs_per_node": 2},
            "faults": {"inject": [{"kind": "slow_rank", "step": 2, "rank": 3, "factor": 2},
                                  {"kind": "loss_spike", "step": 3, "rank": 1, "factor": 5}]}}
    job = Job.objects.create(name="t", owner=user, spec=spec)
    job.start(supervisor="test")
    job.mark_running()
    response = api.post(f"/api/jobs/{job.pk}/reshard/",
                        {"strategy": "NNG", "nodes": 1, "procs_per_node": 2}, format="json")
    assert response.status_code == 202, response.json()
    Supervisor(job, proc=None, ingest=None, me="test").on_event(parse_event(
        {"type": "state", "job": str(job.pk), "step": 3, "time": 0.0, "seq": 100,
         "state": "resharding", "micro_batch": 4,
         "parallel": {"nodes": 1, "procs_per_node": 2, "strategy": "NNG"}}))
    job.refresh_from_db()
    assert [i["rank"] for i in job.spec["faults"]["inject"]] == [1]


@pytest.mark.parametrize("kind", ["pause", "rollback", "reshard", "checkpoint", "resume"])
def test_steering_a_job_in_the_wrong_state_is_409_naming_it(api, user, small_spec, kind):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)  # queued
    body = {"rollback": {"step": 1},
            "reshard": {"strategy": "NNN", "nodes": 1, "procs_per_node": 1}}.get(kind, {})
    response = api.post(f"/api/jobs/{job.pk}/{kind}/", body, format="json")
    assert response.status_code == 409
    assert response.json()["state"] == "queued"
    assert f"job {job.pk} is queued" in response.json()["detail"]
    assert not Command.objects.exists()


def test_resume_queues_a_paused_job_and_cancel_of_a_paused_job_is_immediate(api, running):
    running.request_pause("user", "ada")
    running.mark_paused("checkpointed")
    resumed = api.post(f"/api/jobs/{running.pk}/resume/").json()
    assert (resumed["kind"], resumed["state"]) == ("resume", "done")
    running.refresh_from_db()
    assert running.state == State.QUEUED
    assert running.transitions.last().message.startswith("resume requested")

    running.start(supervisor="test")
    running.mark_running()
    running.request_pause("user", "ada")
    running.mark_paused("checkpointed")
    cancelled = api.post(f"/api/jobs/{running.pk}/cancel/").json()
    assert cancelled["state"] == "done"
    running.refresh_from_db()
    assert running.state == State.CANCELLED


def test_a_retried_post_with_the_same_idempotency_key_does_nothing_twice(api, user, small_spec,
                                                                         other_user, running):
    jobs = Job.objects.count()
    first = api.post("/api/jobs/", small_spec, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = api.post("/api/jobs/", small_spec, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() and again["Idempotent-Replayed"] == "true"
    assert Job.objects.count() == jobs + 1

    # steer a job of its own: the one just created is queued, a worker may start it any time
    pause = api.post(f"/api/jobs/{running.pk}/pause/", HTTP_IDEMPOTENCY_KEY="p-1")
    assert api.post(f"/api/jobs/{running.pk}/pause/", HTTP_IDEMPOTENCY_KEY="p-1").json() == \
        pause.json()
    assert Command.objects.count() == 1

    reused = api.post(f"/api/jobs/{running.pk}/checkpoint/", HTTP_IDEMPOTENCY_KEY="k-1")
    assert reused.status_code == 422 and "Idempotency-Key" in reused.json()
    # keys are per user: another user's same key is a new request
    bob = APIClient()
    bob.force_authenticate(other_user)
    assert bob.post("/api/jobs/", small_spec, format="json",
                    HTTP_IDEMPOTENCY_KEY="k-1").status_code == 201
    assert Job.objects.count() == jobs + 2
