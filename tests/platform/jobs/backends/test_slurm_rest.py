"""jobs.backends.slurm_rest on a real Slurm with a real slurmrestd (tests/slurm.py: two
emulated nodes, slurmrestd with JWT authentication), each call checked against what Slurm's
clients (jobs.backends.slurm.Clients) say of the same Slurm job:

- the REST job descriptor carries the options of the `#SBATCH` lines, and Slurm gives the job
  the same ones whichever way it was submitted;
- a job submitted through slurmrestd is followed to its end with the state, reason and exit
  code the clients report; one Slurm holds pending shows Slurm's reason; cancelling and
  signalling reach it;
- a job Slurm does not warn of its time limit (slurmrestd cannot ask it to) is warned by the
  platform, once, when the batch script's trap would have been;
- a partition's limits refuse the same fields through slurmrestd as through `scontrol`, and a
  node Slurm marks down is lost alike;
- a bad token, or a slurmrestd that does not answer, is a SlurmError saying so.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import redis

from bench.slurm_cluster import MAX_NODES, MAX_TIME_MIN, PARTITION
from engine.contract import TIME_LIMIT_COMMAND, control_stream
from engine.ports import free_port
from jobs.backends.options import partition_errors
from jobs.backends.slurm import CLIENTS, batch_script, sbatch_options, slurm
from jobs.backends.slurm_calls import ALIVE, SlurmError
from jobs.backends.slurm_rest import NOT_SENT, REST_NAMES, SlurmRest, descriptor
from jobs.backends.slurm_run import SlurmRun
from jobs.launch import run_dir
from jobs.models import Job
from tests.slurm import slurm_cluster  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db

# scontrol's fields that the batch script's options set
OPTION_FIELDS = ("JobName", "NumNodes", "NumTasks", "CPUs/Task", "TimeLimit", "Partition",
                 "ExcNodeList", "StdOut", "StdErr", "WorkDir", "Requeue")


@pytest.fixture
def rest_cluster(slurm_cluster):  # noqa: F811
    """Two nodes and slurmrestd; the REST side as root."""
    cluster = slurm_cluster(2, rest=True)
    cluster.rest = SlurmRest(cluster.rest_url, "root", cluster.token)
    return cluster


@pytest.fixture
def over_rest(rest_cluster, settings):
    """The platform talks to the cluster through its slurmrestd."""
    settings.SLURMRESTD_URL = rest_cluster.rest_url
    settings.SLURMRESTD_USER, settings.SLURMRESTD_TOKEN = "root", rest_cluster.token
    return settings


def one_node_job(user, cluster) -> Job:
    """A job on one of the two nodes, the other excluded, with each option the partition
    takes."""
    return Job.objects.create(
        name="rest", owner=user, backend="slurm",
        spec={"parallel": {"nodes": 1, "procs_per_node": 2, "hosts": 1}},
        backend_options={"slurm": {"partition": "ringside", "time_limit": 5},
                         "exclude": [cluster.node(1)]})


def script_of(job: Job, command: list[str]) -> Path:
    """The job's batch script with `command` as what `srun` starts on each node."""
    path = run_dir(job) / "slurm.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(batch_script(job, job.spec, command, ["true"]), encoding="utf-8")
    return path


def shown(cluster, slurm_id: str) -> dict[str, str]:
    return dict(item.partition("=")[::2] for item in
                cluster.client("scontrol", "-o", "show", "job", slurm_id).split())


def ended(cluster, slurm_id: str, eventually) -> None:
    eventually(lambda: CLIENTS.look(slurm_id).state not in ALIVE, 60,
               lambda: f"{CLIENTS.look(slurm_id)}\n{cluster.log_tail('slurmctld')}")


def test_the_rest_descriptor_carries_every_option_of_the_sbatch_lines_but_the_warning(user):
    job = Job.objects.create(
        name="d", owner=user, backend="slurm",
        spec={"parallel": {"nodes": 4, "procs_per_node": 2, "hosts": 2}},
        backend_options={"slurm": {"partition": "p", "account": "a", "qos": "q",
                                   "constraint": "ib", "gres": "gpu:4", "time_limit": 9},
                         "exclude": ["n1", "n2"]})
    lines = [line.removeprefix("#SBATCH --") for line in
             batch_script(job, job.spec, ["x"], ["y"]).splitlines()
             if line.startswith("#SBATCH ")]
    sbatch = dict((line.partition("=")[0], line.partition("=")[2] or True) for line in lines)
    sent = descriptor(sbatch_options(job, job.spec), {"PATH": "/bin"})
    assert sent.pop("environment") == {"PATH": "/bin"}  # slurmrestd requires one
    assert sent == {REST_NAMES[name]: value for name, value in sbatch.items()
                    if name not in NOT_SENT}
    assert set(sbatch) == set(REST_NAMES) - {"cpus-per-task"}  # gres instead: every option
    assert sbatch["signal"].startswith("B:USR1@")


def test_a_job_submitted_through_slurmrestd_runs_as_one_submitted_with_sbatch_and_is_seen_alike(
        rest_cluster, user, eventually):
    job = one_node_job(user, rest_cluster)
    script = script_of(job, ["sh", "-c", "exit 3"])  # srun's step fails: so does the job
    options = sbatch_options(job, job.spec)
    by_cli, by_rest = CLIENTS.submit(script, options), rest_cluster.rest.submit(script, options)
    for slurm_id in (by_cli, by_rest):
        ended(rest_cluster, slurm_id, eventually)
    cli, rest = shown(rest_cluster, by_cli), shown(rest_cluster, by_rest)
    assert {f: rest[f] for f in OPTION_FIELDS} == {f: cli[f] for f in OPTION_FIELDS}
    assert rest["ExcNodeList"] == rest_cluster.node(1) and rest["TimeLimit"] == "00:05:00"
    for slurm_id in (by_cli, by_rest):
        seen = rest_cluster.rest.look(slurm_id)
        assert seen == CLIENTS.look(slurm_id)
        assert (seen.state, seen.code) == ("FAILED", 3), seen


def test_a_pending_job_shows_slurms_reason_and_cancelling_or_signalling_reaches_it(
        rest_cluster, eventually, tmp_path):
    rest = rest_cluster.rest
    script = tmp_path / "sleep.sh"
    script.write_text("#!/bin/bash\nsleep 300\n")
    # every CPU of both nodes: the next such job waits
    whole = {"nodes": "2", "cpus-per-task": str(rest_cluster.cpus), "output": "/dev/null",
             "chdir": str(tmp_path)}
    running = rest.submit(script, whole)
    eventually(lambda: rest.look(running).state == "RUNNING", 30, lambda: str(rest.look(running)))
    by_rest, by_cli = rest.look(running), CLIENTS.look(running)
    assert by_rest._replace(nodes="", ends_at=None) == by_cli._replace(nodes="")
    assert by_rest.ends_at is not None and by_cli.ends_at is None  # Slurm warns the latter
    assert rest.hostnames(by_rest.nodes) == CLIENTS.hostnames(by_cli.nodes) == [
        rest_cluster.node(h) for h in range(2)]  # where it runs, as the clients say
    pending = rest.submit(script, whole)
    eventually(lambda: CLIENTS.look(pending).reason not in ("", "None"), 30,
               lambda: str(CLIENTS.look(pending)))
    seen = rest.look(pending)
    assert seen.state == "PENDING" and seen.reason == CLIENTS.look(pending).reason, seen

    rest.cancel(pending)
    assert CLIENTS.look(pending).state == "CANCELLED"
    rest.cancel(running, signal.SIGTERM)  # to its batch shell too: the job ends
    ended(rest_cluster, running, eventually)
    assert rest.look(running) == CLIENTS.look(running)
    assert rest.lost_nodes([rest_cluster.node(h) for h in range(2)]) == []


def test_a_job_slurm_does_not_warn_is_warned_by_the_platform_once_its_time_limit_is_near(
        over_rest, rest_cluster, user, platform_redis_url, eventually):
    over_rest.SLURM_POLL_S = 0
    over_rest.SLURM_SIGNAL_LEAD_S = 120  # more than its whole time limit: due at once
    job = Job.objects.create(name="timed", owner=user, backend="slurm",
                             spec={"parallel": {"nodes": 1, "procs_per_node": 1, "hosts": 1}},
                             backend_options={"slurm": {"time_limit": 1}})
    bus = redis.Redis.from_url(platform_redis_url)
    bus.delete(control_stream(str(job.pk)))  # an earlier test's job of the same id
    script = script_of(job, ["sh", "-c", "sleep 300"])  # the launcher's arguments ignored
    run = SlurmRun(job, slurm().submit(script, sbatch_options(job, job.spec)))
    try:
        eventually(lambda: run.poll() is None and run.state == "RUNNING", 30,
                   lambda: f"{run.state}\n{rest_cluster.log_tail('slurmctld')}\n"
                           f"{(run_dir(job) / 'stderr.log').read_text(errors='replace')}")
        for _ in range(3):
            assert run.poll() is None
        over_rest.SLURMRESTD_URL = ""  # through the clients: the script's trap warns it
        SlurmRun(job, run.slurm_id).poll()
        sent = [json.loads(fields[b"command"])
                for _, fields in bus.xrange(control_stream(str(job.pk)))]
        assert sent == [{"kind": "pause", "args": {}, "id": TIME_LIMIT_COMMAND}]
    finally:
        CLIENTS.cancel(run.slurm_id)
        bus.close()


def test_the_partitions_limits_refuse_the_same_fields_through_slurmrestd_as_through_scontrol(
        rest_cluster, settings, monkeypatch):
    rest_cluster.client("scontrol", "create", "PartitionName=days", "Nodes=ALL", "MaxNodes=1",
                        "MaxTime=1-00:10:00")
    rest_cluster.client("scontrol", "create", "PartitionName=free", "Nodes=ALL", "Hidden=YES",
                        "MaxNodes=UNLIMITED", "MaxTime=UNLIMITED")
    over = {"parallel.hosts", "slurm.time_limit"}
    cases = [  # (options, hosts) -> the fields refused
        (({"time_limit": MAX_TIME_MIN + 1}, MAX_NODES + 1), over),  # the default partition
        (({"partition": PARTITION, "time_limit": MAX_TIME_MIN}, MAX_NODES), set()),
        (({"partition": "nosuch"}, 1), {"slurm.partition"}),
        (({"partition": "days", "time_limit": 1451}, 2), over),
        (({"partition": "days", "time_limit": 1450}, 1), set()),
        (({"partition": "free", "time_limit": 525600}, 64), set())]
    by_cli = [partition_errors(*case) for case, _ in cases]
    assert [set(errors) for errors in by_cli] == [fields for _, fields in cases], by_cli
    assert "at most 1 nodes" in by_cli[3]["parallel.hosts"]

    settings.SLURMRESTD_URL = rest_cluster.rest_url
    settings.SLURMRESTD_USER, settings.SLURMRESTD_TOKEN = "root", rest_cluster.token
    monkeypatch.setenv("SLURM_CONF", "/nonexistent")  # no client reaches the cluster now
    assert [partition_errors(*case) for case, _ in cases] == by_cli


def test_a_node_slurm_marks_down_is_lost_through_slurmrestd_as_through_sinfo(
        rest_cluster, eventually):
    nodes = [rest_cluster.node(h) for h in range(2)]
    rest_cluster.kill_node(1)
    eventually(lambda: rest_cluster.client("sinfo", "-h", "-n", nodes[1], "-o", "%t")
               .startswith("down"), 60, lambda: rest_cluster.log_tail("slurmctld"))
    assert rest_cluster.rest.lost_nodes(nodes) == CLIENTS.lost_nodes(nodes) == [nodes[1]]


def test_a_bad_token_or_a_slurmrestd_that_does_not_answer_is_a_slurm_error_saying_so(
        rest_cluster):
    for call in (lambda rest: rest.lost_nodes(["x"]), lambda rest: rest.look("1")):
        # slurmrestd 22.05 says no more than that the controller failed: the hint is ours
        with pytest.raises(SlurmError, match=r"HTTP 500: Unspecified error.*refusing user "
                                             "'root''s token: check RINGSIDE_SLURMRESTD_USER"):
            call(SlurmRest(rest_cluster.rest_url, "root", "not-a-jwt"))
    gone = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SlurmError, match=f"slurmrestd at {gone}: GET /job/1: ConnectError"):
        SlurmRest(gone, "root", rest_cluster.token).look("1")
