"""jobs.backends.slurm on a real Slurm (tests/slurm.py: slurmctld in the root namespace, a
slurmd in each of two emulated hosts' namespaces) with a real worker on a login node's part
(`manage.py worker`, RINGSIDE_SLURM_SUBMIT=1) supervising what it submits:

- options that could smuggle a line into the batch script, or that the partition would refuse,
  are refused with the field named;
- a job Slurm holds pending shows Slurm's reason as its waiting reason, and cancelling it
  cancels the Slurm job;
- a 2-node x 2-rank job submitted through the API completes on Slurm, through its clients and
  through slurmrestd, its page following it live, with the losses of the same job on Ringside's
  own hosts; one near its time limit is warned (SIGUSR1), checkpoints, is submitted again from
  there and completes; a paused one gives its allocation back, and its resume and a reshard onto
  one node are new submissions; one that loses a node mid-run (its slurmd and ranks killed) goes
  on on the other, or, when `min_hosts` needs both, waits in Slurm's queue at its full size until
  the node is back; every step is stored once (minutes on two cores each: `make bench`);
- a reshard onto another host count is refused for a job on Ringside's own hosts.
"""

from __future__ import annotations

import json
import math
import os
import time
from urllib.parse import urlsplit

import pytest
from websockets.sync.client import connect

from bench.slurm_cluster import MAX_NODES, MAX_TIME_MIN, PARTITION
from common.services import stop_process_group
from jobs.backends.slurm import CLIENTS
from jobs.backends.slurm_calls import ALIVE
from jobs.models import ApiToken, Job, State
from monitor.models import Event, MetricPoint
from tests.platform.services import worker_process
from tests.slurm import slurm_cluster  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"HOST_BEAT_S": "1", "JOB_HEARTBEAT_S": "0.5", "RINGSIDE_SLURM_POLL_S": "0.5",
        "WORKER_SLOTS": "4"}
look = CLIENTS.look  # what Slurm's clients say of a Slurm job
START_S = 180  # Slurm allocating, then four ranks starting, on a loaded two-core machine
LEAD_S = 120  # how long before its time limit the time-limit test's job is warned


def spec(name: str, hosts: int, steps: int) -> dict:
    return {"name": name, "model": {"preset": "tiny"},
            "parallel": {"nodes": 2, "procs_per_node": 2, "hosts": hosts},
            "train": {"steps": steps, "micro_batch": 2, "seq_len": 64, "eval_every": 0,
                      "threads": 1, "trace_every": 0},
            "checkpoint": {"every": 3}}


@pytest.fixture
def worker_env() -> dict[str, str]:
    """What a test adds to the Slurm worker's environment (parametrize it to change it)."""
    return {}


@pytest.fixture
def slurm_access() -> str:
    """How the platform reaches Slurm: "clients" (sbatch, squeue, ...) or "rest" (slurmrestd);
    parametrize it to change it."""
    return "clients"


@pytest.fixture
def slurm_platform(slurm_cluster, service_env, tmp_path, session_worker_host_drained,  # noqa: F811
                   worker_env, slurm_access, settings):
    """The cluster, and a worker that submits to it, on this session's database and Redis
    (the nodes reach that Redis at host 0's gateway). Through slurmrestd, neither the worker nor
    the API has Slurm's configuration: no client of theirs could reach the cluster."""
    redis = urlsplit(service_env["REDIS_URL"])
    cluster = slurm_cluster(2, forward=(redis.port,), rest=slurm_access == "rest")
    bus = redis._replace(netloc=f"{cluster.spec.gateway(0)}:{redis.port}").geturl()
    env = {**service_env, **cluster.env, **FAST, "RINGSIDE_SLURM_SUBMIT": "1",
           "RINGSIDE_SLURM_BUS_URL": bus, "RINGSIDE_HOST_NAME": f"slurm-login-{os.getpid()}",
           **worker_env}
    if slurm_access == "rest":
        over_rest = {"URL": cluster.rest_url, "USER": "root", "TOKEN": cluster.token}
        env |= {f"RINGSIDE_SLURMRESTD_{name}": value for name, value in over_rest.items()}
        env["SLURM_CONF"] = "/nonexistent"
        for name, value in over_rest.items():
            setattr(settings, f"SLURMRESTD_{name}", value)
    worker = worker_process(env, tmp_path / "worker.log")
    cluster.worker_log = worker.log_path
    yield cluster
    stop_process_group(worker, grace_s=10)


def finished(job: Job, cluster, eventually, timeout: float) -> Job:
    """`job` once it completed or failed."""
    eventually(lambda: Job.objects.get(pk=job.pk).state in (State.COMPLETED, State.FAILED),
               timeout, lambda: diagnosis(job, cluster))
    job.refresh_from_db()
    return job


def diagnosis(job: Job, cluster) -> str:
    job.refresh_from_db()
    run = f"{cluster.worker_log.read_text(errors='replace')[-2000:]}"
    return f"{job.state} ({job.waiting_reason}) {job.error}\n--- worker\n{run}"


def test_options_that_would_smuggle_a_line_into_the_batch_script_are_refused(api):
    def refused(slurm: dict) -> set[str]:
        body = {**spec("evil", 1, 1), "backend": "slurm", "slurm": slurm}
        return set(api.post("/api/jobs/", body, format="json").json()["errors"])

    assert "slurm.partition" in refused({"partition": "x\n#SBATCH --uid=0"})
    assert refused({"account": "a;rm -rf /", "gres": "gpu:4 --wrap=id", "qos": "$(id)",
                    "constraint": "a b", "time_limit": 0}) == {
        "slurm.account", "slurm.gres", "slurm.qos", "slurm.constraint", "slurm.time_limit"}
    assert refused({"nodes": 3}) == {"slurm.nodes"}
    assert not Job.objects.exists()


def test_a_backend_it_does_not_know_and_slurm_options_for_the_hosts_are_refused(api):
    for body, field in [({"backend": "kubernetes"}, "backend"),
                        ({"backend": "hosts", "slurm": {"qos": "high"}}, "slurm")]:
        errors = api.post("/api/jobs/", {**spec("b", 1, 1), **body}, format="json").json()
        assert field in errors["errors"]


def test_a_job_over_the_partitions_limits_is_refused_naming_the_field(slurm_cluster, api):  # noqa: F811
    slurm_cluster(2)
    body = {**spec("big", MAX_NODES + 1, 1), "backend": "slurm",
            "slurm": {"partition": PARTITION, "time_limit": MAX_TIME_MIN + 1}}
    body["parallel"]["nodes"] = MAX_NODES + 1
    errors = api.post("/api/jobs/", body, format="json").json()["errors"]
    assert set(errors) == {"parallel.hosts", "slurm.time_limit"}
    assert f"at most {MAX_NODES} nodes" in errors["parallel.hosts"]
    unknown = api.post("/api/jobs/", {**spec("p", 1, 1), "backend": "slurm",
                                      "slurm": {"partition": "nosuch"}}, format="json").json()
    assert "slurm.partition" in unknown["errors"]


def test_a_job_slurm_holds_pending_says_why_and_cancelling_it_cancels_the_slurm_job(
        slurm_platform, api, eventually):
    # both nodes taken by someone else's job: ours waits in Slurm's queue
    other = slurm_platform.client("sbatch", "--parsable", "-N", "2", "--exclusive",
                                  "--output", "/dev/null", "--wrap", "sleep 300").strip()
    eventually(lambda: look(other)[0] == "RUNNING", 30, "the other job runs")
    try:
        created = api.post("/api/jobs/", {**spec("waits", 2, 3), "backend": "slurm"},
                           format="json")
        assert created.status_code == 201, created.json()
        job = Job.objects.get(pk=created.json()["id"])

        def pending() -> bool:
            job.refresh_from_db()
            return job.waiting_reason.startswith("Slurm holds it pending:")
        eventually(pending, 60, lambda: diagnosis(job, slurm_platform))
        assert look(job.backend_ref)[0] == "PENDING", (
            look(job.backend_ref), look(other), slurm_platform.log_tail("slurmctld"))

        assert api.post(f"/api/jobs/{job.pk}/cancel/").status_code == 202
        eventually(lambda: Job.objects.get(pk=job.pk).state == State.CANCELLED, 30,
                   lambda: diagnosis(job, slurm_platform))
        assert look(job.backend_ref)[0] == "CANCELLED"
        assert Job.objects.get(pk=job.pk).waiting_reason == ""
    finally:
        slurm_platform.client("scancel", other)


def steps_shown(live_server_url: str, token: str, job_id: int, last: int,
                timeout: float) -> tuple[set[int], set[int]]:
    """What the job page's socket shows of the job's steps until step `last`: those its
    snapshot held, and those pushed live after it."""
    url = f"ws{live_server_url.removeprefix('http')}/ws/jobs/{job_id}/?token={token}"
    deadline = time.monotonic() + timeout
    with connect(url, open_timeout=30) as ws:
        snapshot = json.loads(ws.recv(timeout=30))
        held = set(snapshot["series"].get("loss", {}).get("step", []))
        pushed: set[int] = set()
        while last not in held | pushed:
            message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message["type"] == "step":
                pushed.add(message["step"])
    return held, pushed


@pytest.mark.bench
@pytest.mark.parametrize("slurm_access", ["clients", "rest"])
def test_a_two_node_job_completes_on_slurm_with_the_losses_of_ringsides_own_hosts(
        slurm_platform, api, user, live_server_url, eventually):
    on_slurm = api.post("/api/jobs/", {**spec("on-slurm", 2, 6), "backend": "slurm"},
                        format="json").json()["id"]
    on_hosts = api.post("/api/jobs/", spec("on-hosts", 1, 6), format="json").json()["id"]
    token = ApiToken.objects.create(user=user, name="page").key
    held, pushed = steps_shown(live_server_url, token, on_slurm, 6, 2 * START_S)
    assert held | pushed == set(range(1, 7)) and 6 in pushed  # the page follows it live
    for pk in (on_slurm, on_hosts):
        job = finished(Job.objects.get(pk=pk), slurm_platform, eventually, 2 * START_S)
        assert job.state == State.COMPLETED, diagnosis(job, slurm_platform)
    slurm_job = Job.objects.get(pk=on_slurm)
    assert look(slurm_job.backend_ref)[:3:2] == ("COMPLETED", 0)
    losses = [list(MetricPoint.objects.filter(job_id=pk, name="loss").order_by("step")
                   .values_list("step", "value")) for pk in (on_slurm, on_hosts)]
    assert [step for step, _ in losses[0]] == list(range(1, 7))  # every step stored once
    for (_, a), (_, b) in zip(*losses, strict=True):
        assert math.isclose(a, b, rel_tol=1e-4)


@pytest.mark.bench
# minutes by design: Slurm checks time limits every 30 s and they are whole minutes
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("worker_env", [{"RINGSIDE_SLURM_SIGNAL_LEAD_S": str(LEAD_S)}])
def test_a_job_warned_of_its_time_limit_checkpoints_and_goes_on_in_a_new_submission(
        slurm_platform, api, eventually):
    steps = 100
    created = api.post("/api/jobs/", {**spec("timed", 1, steps), "backend": "slurm",
                                      "slurm": {"time_limit": MAX_TIME_MIN}}, format="json")
    assert created.status_code == 201, created.json()
    job = Job.objects.get(pk=created.json()["id"])
    trained(job, 3, slurm_platform, eventually)
    first = Job.objects.get(pk=job.pk).backend_ref
    near_its_limit(slurm_platform, first)
    job = finished(job, slurm_platform, eventually, 3 * START_S)
    assert job.state == State.COMPLETED, diagnosis(job, slurm_platform)
    assert job.launches >= 2
    assert job.transitions.filter(message__startswith="the Slurm time limit was near").exists()
    # the first Slurm job ended at the engine's pause (exit 3), before Slurm's limit killed it
    assert look(first)[:3:2] == ("FAILED", 3), look(first)
    assert stored_steps(job) == list(range(1, steps + 1))  # every step once


@pytest.mark.bench
def test_pause_releases_the_allocation_and_resume_and_a_reshard_onto_one_node_are_new_submissions(
        slurm_platform, api, eventually):
    steps = 40
    created = api.post("/api/jobs/", {**spec("steered", 2, steps), "backend": "slurm"},
                       format="json")
    job = Job.objects.get(pk=created.json()["id"])
    trained(job, 3, slurm_platform, eventually)
    first = Job.objects.get(pk=job.pk).backend_ref
    assert api.post(f"/api/jobs/{job.pk}/pause/").status_code == 202
    eventually(lambda: Job.objects.get(pk=job.pk).state == State.PAUSED, START_S,
               lambda: diagnosis(job, slurm_platform))
    assert look(first)[0] not in ALIVE  # the allocation is given back
    slurm_platform.wait_idle(range(2))

    assert api.post(f"/api/jobs/{job.pk}/resume/").status_code == 202
    trained(job, len(stored_steps(job)) + 2, slurm_platform, eventually)
    second = Job.objects.get(pk=job.pk).backend_ref
    assert second != first
    strategy = job.spec["parallel"].get("strategy", "GGG")
    resharded = api.post(f"/api/jobs/{job.pk}/reshard/", {
        "strategy": strategy, "nodes": 1, "procs_per_node": 2, "hosts": 1}, format="json")
    assert resharded.status_code == 202, resharded.json()

    def on_one_node() -> bool:
        now = Job.objects.get(pk=job.pk)
        return now.state == State.RUNNING and now.backend_ref not in (first, second)
    eventually(on_one_node, 2 * START_S, lambda: diagnosis(job, slurm_platform))
    third = Job.objects.get(pk=job.pk).backend_ref
    assert nodes_of(slurm_platform, third) in {slurm_platform.node(h) for h in range(2)}
    job = finished(job, slurm_platform, eventually, 2 * START_S)
    assert job.state == State.COMPLETED, diagnosis(job, slurm_platform)
    assert job.spec["parallel"]["hosts"] == 1
    assert job.transitions.filter(message="the engine resumed on its new layout").exists()
    assert stored_steps(job) == list(range(1, steps + 1))


def test_a_reshard_onto_another_host_count_is_refused_for_a_job_on_ringsides_hosts(api):
    created = api.post("/api/jobs/", spec("on-hosts", 1, 1), format="json").json()
    job = Job.objects.get(pk=created["id"])
    job.state = State.RUNNING
    job.save(update_fields=["state"])
    refused = api.post(f"/api/jobs/{job.pk}/reshard/", {
        "strategy": job.spec["parallel"].get("strategy", "GGG"), "nodes": 2,
        "procs_per_node": 2, "hosts": 2}, format="json")
    assert refused.status_code == 400
    assert "hosts" in refused.json(), refused.json()


def node_lost_mid_run(name: str, steps: int, min_hosts: int, slurm_platform, api,
                      eventually) -> tuple[Job, str]:
    """A 2-node job past its first checkpoint (step 3) whose node 1 is then killed; the job
    and its Slurm job's id before the loss."""
    body = {**spec(name, 2, steps), "backend": "slurm"}
    body["parallel"]["min_hosts"] = min_hosts
    created = api.post("/api/jobs/", body, format="json")
    assert created.status_code == 201, created.json()
    job = Job.objects.get(pk=created.json()["id"])
    trained(job, 4, slurm_platform, eventually)
    first = Job.objects.get(pk=job.pk).backend_ref
    slurm_platform.kill_node(1)
    return job, first


@pytest.mark.bench
def test_a_node_lost_mid_run_goes_on_on_the_survivor_with_every_step_stored_once(
        slurm_platform, api, eventually):
    steps = 30
    job, first = node_lost_mid_run("lossy", steps, 1, slurm_platform, api, eventually)
    lost = slurm_platform.node(1)
    eventually(lambda: Job.objects.get(pk=job.pk).backend_ref != first, START_S,
               lambda: diagnosis(job, slurm_platform))
    job = finished(job, slurm_platform, eventually, 2 * START_S)
    assert job.state == State.COMPLETED, diagnosis(job, slurm_platform)
    assert job.backend_options["exclude"] == [lost]
    assert job.spec["parallel"]["hosts"] == 1
    assert nodes_of(slurm_platform, job.backend_ref) == slurm_platform.node(0)
    membership = Event.objects.get(job=job, type="membership")
    assert membership.data["hosts_after"] == [slurm_platform.node(0)], membership.data
    assert stored_steps(job) == list(range(1, steps + 1))


@pytest.mark.bench
def test_a_node_lost_with_too_few_left_waits_in_slurms_queue_and_goes_on_once_it_is_back(
        slurm_platform, api, eventually):
    steps = 8
    job, first = node_lost_mid_run("whole", steps, 2, slurm_platform, api, eventually)

    def waits_for_nodes() -> bool:
        now = Job.objects.get(pk=job.pk)
        return now.backend_ref != first and now.waiting_reason.startswith(
            "Slurm holds it pending:")
    eventually(waits_for_nodes, START_S, lambda: diagnosis(job, slurm_platform))
    job.refresh_from_db()
    assert job.state == State.RUNNING  # not failed: it goes on once Slurm has the nodes
    assert job.spec["parallel"]["hosts"] == 2 and "exclude" not in job.backend_options
    # cancelled, not requeued by Slurm: two of its jobs would train into one run folder
    eventually(lambda: look(first)[0] == "CANCELLED", 30, lambda: str(look(first)))
    assert Event.objects.filter(job=job, type="anomaly", data__kind="host_lost").exists()

    slurm_platform.start_node(1)
    job = finished(job, slurm_platform, eventually, 2 * START_S)
    assert job.state == State.COMPLETED, diagnosis(job, slurm_platform)
    assert job.waiting_reason == ""
    assert sorted(slurm_platform.client("scontrol", "show", "hostnames", nodes_of(
        slurm_platform, job.backend_ref)).split()) == [slurm_platform.node(h) for h in range(2)]
    assert stored_steps(job) == list(range(1, steps + 1))  # every step once


def trained(job: Job, steps: int, cluster, eventually) -> None:
    """Wait until `job` stored the loss of `steps` steps."""
    eventually(lambda: len(stored_steps(job)) >= steps, 2 * START_S,
               lambda: diagnosis(job, cluster))


def stored_steps(job: Job) -> list[int]:
    return sorted(MetricPoint.objects.filter(job_id=job.pk, name="loss")
                  .values_list("step", flat=True))


def nodes_of(cluster, slurm_id: str) -> str:
    """The nodes Slurm gave `slurm_id`, in its compressed form."""
    return slurm_job(cluster, slurm_id)["NodeList"]


def slurm_job(cluster, slurm_id: str) -> dict[str, str]:
    return dict(item.partition("=")[::2] for item in
                cluster.client("scontrol", "-o", "show", "job", slurm_id).split())


def near_its_limit(cluster, slurm_id: str) -> None:
    """Bring the Slurm job's time limit near: Slurm warns a job once at most LEAD_S are left
    (up to its 30 s check earlier), so a limit LEAD_S + [-30, 30) s from now is warned at its
    next check, with at least a minute left to checkpoint (limits are whole minutes)."""
    clock = slurm_job(cluster, slurm_id)["RunTime"].split("-")[-1]  # [D-]HH:MM:SS
    hours, mins, secs = (int(n) for n in clock.split(":"))
    minutes = (hours * 3600 + mins * 60 + secs + LEAD_S + 30) // 60
    cluster.client("scontrol", "update", f"JobId={slurm_id}", f"TimeLimit={minutes}")
