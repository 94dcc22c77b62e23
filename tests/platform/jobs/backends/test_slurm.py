"""jobs.backends.slurm on a real Slurm (tests/slurm.py: slurmctld in the root namespace, a
slurmd in each of two emulated hosts' namespaces) with a real worker on a login node's part
(`manage.py worker`, RINGSIDE_SLURM_SUBMIT=1) supervising what it submits:

- options that could smuggle a line into the batch script, or that the partition would refuse,
  are refused with the field named;
- a job Slurm holds pending shows Slurm's reason as its waiting reason, and cancelling it
  cancels the Slurm job;
- a 2-node x 2-rank job submitted through the API completes on Slurm with the losses of the
  same job on Ringside's own hosts; one near its time limit is warned (SIGUSR1), checkpoints,
  is submitted again from there and completes with every step stored once (minutes on two
  cores: `make bench`).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from bench.slurm_cluster import MAX_NODES, MAX_TIME_MIN, PARTITION
from common.services import REPO_ROOT, stop_process_group
from jobs.backends.slurm import look
from jobs.models import Job, State
from monitor.models import MetricPoint
from tests.slurm import slurm_cluster  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"HOST_BEAT_S": "1", "JOB_HEARTBEAT_S": "0.5", "RINGSIDE_SLURM_POLL_S": "0.5",
        "WORKER_SLOTS": "4"}
START_S = 180  # Slurm allocating, then four ranks starting, on a loaded two-core machine


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
def slurm_platform(slurm_cluster, service_env, tmp_path, session_worker_host_drained,  # noqa: F811
                   worker_env):
    """The cluster, and a worker that submits to it, on this session's database and Redis
    (the nodes reach that Redis at host 0's gateway)."""
    redis = urlsplit(service_env["REDIS_URL"])
    cluster = slurm_cluster(2, forward=(redis.port,))
    bus = redis._replace(netloc=f"{cluster.spec.gateway(0)}:{redis.port}").geturl()
    env = {**service_env, **cluster.env, **FAST, "RINGSIDE_SLURM_SUBMIT": "1",
           "RINGSIDE_SLURM_BUS_URL": bus, "RINGSIDE_HOST_NAME": f"slurm-login-{os.getpid()}",
           **worker_env}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen([sys.executable, str(REPO_ROOT / "manage.py"), "worker"],
                                  env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    cluster.worker_log = log
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


@pytest.mark.bench
def test_a_two_node_job_completes_on_slurm_with_the_losses_of_ringsides_own_hosts(
        slurm_platform, api, eventually):
    on_slurm = api.post("/api/jobs/", {**spec("on-slurm", 2, 6), "backend": "slurm"},
                        format="json").json()["id"]
    on_hosts = api.post("/api/jobs/", spec("on-hosts", 1, 6), format="json").json()["id"]
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
@pytest.mark.parametrize("worker_env", [{"RINGSIDE_SLURM_SIGNAL_LEAD_S": "150"}])
def test_a_job_warned_of_its_time_limit_checkpoints_and_goes_on_in_a_new_submission(
        slurm_platform, api, eventually):
    # warned 150 s before a 4-minute limit (Slurm may warn up to a minute earlier still), so
    # each submission trains a minute or so: it takes two or more to do the steps
    steps = 30
    created = api.post("/api/jobs/", {**spec("timed", 1, steps), "backend": "slurm",
                                      "slurm": {"time_limit": 4}}, format="json")
    assert created.status_code == 201, created.json()
    job = finished(Job.objects.get(pk=created.json()["id"]), slurm_platform, eventually,
                   3 * START_S)
    assert job.state == State.COMPLETED, diagnosis(job, slurm_platform)
    assert job.launches >= 2
    assert job.transitions.filter(message__startswith="the Slurm time limit was near").exists()
    stored = list(MetricPoint.objects.filter(job=job, name="loss").values_list("step", flat=True))
    assert sorted(stored) == list(range(1, steps + 1))  # every step once
