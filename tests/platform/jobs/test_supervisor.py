"""jobs.supervisor: the engine's events move the job, and each move reaches the job's
websocket group exactly once (the state-history row's push; the supervisor adds none); the
fault policy's `exclude` drains the straggler's host and moves the job off it; a job on
fewer hosts than it asked for moves at the first disk checkpoint after a host came back."""

import asyncio

import psutil
import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from engine.contract import parse_event
from hosts.models import Host
from jobs.commands import issue
from jobs.membership import Peers
from jobs.models import Cause, Command, Job, State
from jobs.placement import place
from jobs.supervisor import Supervisor
from monitor.ingest import job_group
from monitor.models import Action, Anomaly
from tests.platform.jobs.test_placement import host
from tests.platform.jobs.test_placement import job as placed_job
from tests.platform.jobs.test_steering import control_commands
from tests.policies import paced

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def starting(user, small_spec) -> Job:
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    job.start(supervisor="test")
    return job


def listen(job: Job):
    """A channel in the job's group; calling the result returns what reached it until it has
    been quiet for a second."""
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(job_group(job.pk), channel)

    async def received() -> list[dict]:
        messages = []
        while True:
            try:
                messages += (await asyncio.wait_for(layer.receive(channel), 1.0))["events"]
            except TimeoutError:
                return messages

    return async_to_sync(received)


def engine_event(job: Job, **fields) -> None:
    """The supervisor handling one engine event, as the ingest hands it over."""
    Supervisor(job, proc=None, ingest=None, me="test").on_event(parse_event(
        {"job": str(job.pk), "step": 3, "time": 1.0, "seq": 7, **fields}))


def test_the_engine_running_moves_the_job_and_its_socket_hears_it_once(starting):
    received = listen(starting)
    engine_event(starting, type="state", state="running", world_size=2)
    starting.refresh_from_db()
    assert starting.state == State.RUNNING
    messages = received()
    assert [(m["type"], m["from_state"], m["state"], m["cause"]) for m in messages[:1]] == [
        ("job", "starting", "running", "engine")]
    # with the job's goodput ledger, which the move brought up to date (monitor.goodput)
    # (and the checkpoint list, pushed at every move: memory checkpoints go with the ranks)
    assert [m["type"] for m in messages if m["type"] != "checkpoints"] == ["job", "goodput"]


def test_a_refused_rollback_moves_the_job_back_to_running_with_one_message(starting):
    starting.mark_running()
    command = issue(starting, "rollback", {"step": 2}, actor="ada", cause=Cause.USER)
    received = listen(starting)
    engine_event(starting, type="action", action="refused", command=str(command.pk),
                 kind="rollback", error="no good checkpoint matches 2")
    starting.refresh_from_db()
    assert starting.state == State.RUNNING
    assert [(m["type"], m["from_state"], m["state"]) for m in received()
            if m["type"] == "job"] == [("job", "rolling_back", "running")]


def test_commands_the_ranks_lost_in_a_restart_are_delivered_to_the_new_ones(starting):
    starting.mark_running()
    pause = issue(starting, "pause", {}, actor="ada", cause=Cause.USER)
    assert [c["id"] for c in control_commands(starting)] == [str(pause.pk)]
    # the policy restarted the ranks before they read it: the new rank 0 reads the stream
    # from its end, and says it runs
    engine_event(starting, type="state", state="running", world_size=2)
    assert [c["id"] for c in control_commands(starting)] == [str(pause.pk)] * 2
    starting.refresh_from_db()
    assert starting.state == State.PAUSING
    # a command the engine answered is not sent again
    engine_event(starting, type="action", action="pause", command=str(pause.pk), by="command")
    engine_event(starting, type="state", state="running", world_size=2)
    assert len(control_commands(starting)) == 2


def test_the_policy_excluding_a_rank_drains_its_host_and_pauses_the_job_to_move_off_it(
        user, session_worker_host_drained):
    for name in ("a", "b", "c"):
        host(name, slots=2)
    job = placed_job(user, hosts=2, min_hosts=1)
    place(job)
    job.refresh_from_db()
    job.start(supervisor="test")
    job.mark_running()
    peers = Peers(job, job.incarnation, node_rank=0)
    supervisor = Supervisor(job, proc=None, ingest=None, me="test", peers=peers)
    supervisor.on_event(parse_event({"job": str(job.pk), "step": 40, "time": 1.0, "seq": 9,
                                     "type": "action", "action": "exclude", "by": "policy",
                                     "anomaly": "straggler", "rank": 2, "rung": 1}))
    second = job.placement[1].host.name
    assert Host.objects.get(name=second).drained  # ranks 2 and 3 run there
    job.refresh_from_db()
    assert job.state == State.PAUSING  # a cold pause, from whose checkpoint it moves
    assert supervisor.regroup.startswith(f"host {second} drained: its rank 2 stayed")


def test_a_job_short_of_hosts_pauses_to_scale_up_at_the_first_disk_checkpoint_after_a_host_returns(
        user, session_worker_host_drained):
    host("a", slots=2)
    job = placed_job(user, hosts=2, min_hosts=1)
    Job.objects.filter(pk=job.pk).update(incarnation=1)  # it ran before, then lost a host
    job.refresh_from_db()
    place(job)  # on the one host up: short of one
    job.refresh_from_db()
    assert [r.host.name for r in job.placement] == ["a"]
    job.start(supervisor="test")
    job.mark_running()
    supervisor = Supervisor(job, proc=None, ingest=None, me="test",
                            peers=Peers(job, job.incarnation, node_rank=0))
    checkpoint = {"job": str(job.pk), "time": 1.0, "type": "checkpoint", "path": "/c",
                  "blocking_s": 0.1, "size_bytes": 1, "strategy": "NNN", "world_size": 2}
    supervisor.on_event(parse_event({**checkpoint, "step": 10, "seq": 5, "tier": "disk"}))
    job.refresh_from_db()
    assert job.state == State.RUNNING and supervisor.regroup == ""  # nowhere to grow

    host("b", slots=2)  # back, before the supervisor looked at its peers again
    supervisor.on_event(parse_event({**checkpoint, "step": 15, "seq": 6, "tier": "memory"}))
    job.refresh_from_db()
    assert job.state == State.RUNNING  # a memory checkpoint is this host's alone
    supervisor.on_event(parse_event({**checkpoint, "step": 20, "seq": 7, "tier": "disk"}))
    job.refresh_from_db()
    assert job.state == State.PAUSING
    assert supervisor.regroup == "scaling back up from 1 to 2 hosts"


def test_a_checkpoint_over_the_owners_storage_quota_pauses_the_job_and_deletes_nothing(
        user, small_spec, tmp_path):
    from jobs.models import Checkpoint, JobEvent, Quota
    from tests.platform.services import stored_checkpoint

    Quota.objects.create(user=user, checkpoint_bytes=1000)
    older = Job.objects.create(name="older", owner=user, spec=small_spec)
    kept = stored_checkpoint(tmp_path / "older" / "step-2")
    Checkpoint.objects.create(job=older, seq=1, step=2, time=1.0, path=kept, size_bytes=600)
    # one retention deleted (its folder is gone) does not count
    Checkpoint.objects.create(job=older, seq=2, step=4, time=1.0, path=str(tmp_path / "gone"),
                              size_bytes=10**9)
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    job.start(supervisor="test")
    job.mark_running()
    supervisor = Supervisor(job, proc=None, ingest=None, me="test")
    checkpoint = {"job": str(job.pk), "time": 1.0, "type": "checkpoint", "tier": "disk",
                  "blocking_s": 0.1, "strategy": "NNN", "world_size": 1}
    under = stored_checkpoint(tmp_path / "t" / "step-3")
    Checkpoint.objects.create(job=job, seq=5, step=3, time=1.0, path=under, size_bytes=400)
    supervisor.on_event(parse_event({**checkpoint, "step": 3, "seq": 5, "path": under,
                                     "size_bytes": 400}))
    job.refresh_from_db()
    assert job.state == State.RUNNING  # 1000 bytes: at the quota, not over it

    over = stored_checkpoint(tmp_path / "t" / "step-6")
    Checkpoint.objects.create(job=job, seq=6, step=6, time=1.0, path=over, size_bytes=1)
    supervisor.on_event(parse_event({**checkpoint, "step": 6, "seq": 6, "path": over,
                                     "size_bytes": 1}))
    job.refresh_from_db()
    assert job.state == State.PAUSING
    paused = JobEvent.objects.filter(job=job, to_state=State.PAUSING).get()
    assert paused.cause == Cause.POLICY
    assert "take 1,001 bytes, over their checkpoint storage quota of 1,000 bytes" in (
        paused.message)
    assert all(Checkpoint.objects.get(path=p).available for p in (kept, under, over))


def paced_job(api, spec: dict, eventually, worker, procs: int,
              restart_at: int | None = None) -> int:
    """A long nano job on `procs` ranks, paced (tests.policies), through the API, once it
    trains; with `restart_at`, a loss spike at that step that the policy answers by
    restarting the ranks."""
    spec["train"]["steps"] = 100_000
    spec["parallel"] = {"nodes": 1, "procs_per_node": procs}
    spec["faults"] = paced(procs)  # the default pace: ranks asleep 9 in 10 of a forward
    if restart_at is not None:
        spec["faults"]["inject"].append(
            {"kind": "loss_spike", "step": restart_at, "rank": 0, "factor": 10.0})
        policy = spec["faults"]["policy"]
        spec["faults"]["policy"] = {**policy,
                                    "actions": {**policy["actions"], "loss_spike": ["restart"]}}
    job_id = api.post("/api/jobs/", spec, format="json").json()["id"]
    eventually(lambda: Job.objects.get(pk=job_id).step >= 2, 120,
               f"job {job_id} made no progress; worker log: {worker.log_path}")
    return job_id


def crash_ranks(job_id: int) -> None:
    """Kill the job's ranks at once, as a crash would: its launcher restarts them. (The ranks
    are the children of the launcher's forkserver.)"""
    run = str(settings.RUNS_DIR / str(job_id))
    launcher = next(p for p in psutil.process_iter(["cmdline"]) if run in (p.info["cmdline"] or []))
    ranks = [rank for child in launcher.children() for rank in child.children()]
    assert ranks, "no ranks found"
    for rank in ranks:
        rank.kill()


def settled(job_id: int) -> list[str]:
    """The job's commands' states; none left open."""
    job = Job.objects.get(pk=job_id)
    assert not Command.open_for(job).exists()
    return list(job.commands.values_list("state", flat=True))


def test_a_pause_sent_while_the_ranks_restart_is_carried_out_by_the_new_ones(
        api, celery_worker, small_spec, eventually):
    job_id = paced_job(api, small_spec, eventually, celery_worker, procs=1)
    crash_ranks(job_id)
    # sent before the new ranks' rank 0 opens the control stream, which it reads from its end
    assert api.post(f"/api/jobs/{job_id}/pause/", {}, format="json").status_code == 202
    eventually(lambda: Job.objects.get(pk=job_id).state == State.PAUSED, 120,
               f"the pause was not carried out; worker log: {celery_worker.log_path}")
    assert settled(job_id) == ["done"]
    job = Job.objects.get(pk=job_id)
    assert Action.objects.filter(job=job, action="restart").exists()
    assert list(job.transitions.values_list("to_state", flat=True))[-2:] == ["pausing", "paused"]
    assert api.post(f"/api/jobs/{job_id}/cancel/", {}, format="json").status_code == 202


def test_a_pause_sent_while_the_policy_restarts_the_ranks_is_carried_out_by_the_new_ones(
        api, celery_worker, small_spec, eventually):
    job_id = paced_job(api, small_spec, eventually, celery_worker, procs=1, restart_at=8)
    eventually(lambda: Action.objects.filter(job_id=job_id, action="restart").exists(), 120,
               f"the policy did not restart the ranks; worker log: {celery_worker.log_path}")
    assert api.post(f"/api/jobs/{job_id}/pause/", {}, format="json").status_code == 202
    eventually(lambda: Job.objects.get(pk=job_id).state == State.PAUSED, 120,
               f"the pause was not carried out; worker log: {celery_worker.log_path}")
    assert settled(job_id) == ["done"]
    job = Job.objects.get(pk=job_id)
    assert list(job.transitions.values_list("to_state", flat=True))[-2:] == ["pausing", "paused"]
    # a policy restart is not a crash: nothing says one happened
    assert not Anomaly.objects.filter(job=job, kind="crash").exists()
    assert api.post(f"/api/jobs/{job_id}/cancel/", {}, format="json").status_code == 202


def test_a_pause_raced_with_a_rollback_and_a_reshard_leaves_no_state_unsettled(
        api, celery_worker, small_spec, eventually):
    job_id = paced_job(api, small_spec, eventually, celery_worker, procs=2)

    def steer(kind: str, body: dict) -> int:
        response = api.post(f"/api/jobs/{job_id}/{kind}/", body, format="json")
        if response.status_code == 202:  # a pause sent in the same breath: answered at once
            pause = api.post(f"/api/jobs/{job_id}/pause/", {}, format="json")
            assert pause.status_code == 409, pause.json()
            assert pause.json()["state"] in ("rolling_back", "resharding")
        eventually(lambda: Job.objects.get(pk=job_id).state == State.RUNNING, 120,
                   f"the {kind} did not end; worker log: {celery_worker.log_path}")
        return response.status_code

    checkpoint = api.post(f"/api/jobs/{job_id}/checkpoint/", {}, format="json").json()
    eventually(lambda: Command.objects.get(pk=checkpoint["id"]).state == "done", 60,
               "no checkpoint")
    assert steer("rollback", {"step": Command.objects.get(pk=checkpoint["id"]).result[
        "step"]}) == 202
    assert steer("reshard", {"strategy": "NNN", "nodes": 1, "procs_per_node": 1}) == 202
    assert Job.objects.get(pk=job_id).spec["parallel"]["procs_per_node"] == 1
    assert api.post(f"/api/jobs/{job_id}/pause/", {}, format="json").status_code == 202
    eventually(lambda: Job.objects.get(pk=job_id).state == State.PAUSED, 120,
               f"the pause was not carried out; worker log: {celery_worker.log_path}")
    assert settled(job_id) == ["done"] * 4
