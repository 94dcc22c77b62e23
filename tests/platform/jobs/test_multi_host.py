"""Jobs across hosts, on the one-machine cluster (tests/platform/cluster.py): real workers in
network namespaces, each a registered host at its own address, placing, launching and
supervising real multi-host engine runs (gloo between the namespaces, through rate-limited
links). Needs root; skipped, saying so, elsewhere. Minutes of training on two cores, so these
run in `make bench` (`pytest -m bench`), not `make test`.

- a 2-host job trains the same losses as the same layout on one host;
- a lost host, the lead (rank 0's launcher, the rendezvous endpoint, the supervisor) or not,
  moves the job to the survivor from its newest checkpoint, every step stored once; the host
  coming back grows it back to two hosts at its next checkpoint;
- a host lost after a memory snapshot costs only the steps since it: the survivor holds the
  lost host's part as a replica and continues from it, not from the older disk checkpoint;
- two jobs for one host's slots never share a slot, and run one after the other;
- a job asking for more hosts than are up waits, with its reason, and runs once they register.
"""

from __future__ import annotations

import math
import shutil

import pytest
from django.db import transaction

from bench.worker_loss import TRAINING_ANOMALIES
from engine.checkpoint import find_latest_good
from engine.contract import memory_dir
from hosts.models import Host
from jobs.dispatch import dispatch
from jobs.launch import checkpoint_folder
from jobs.models import Cause, Job, JobEvent, Reservation, State
from monitor.models import Event, MetricPoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.bench,
              pytest.mark.usefixtures("session_worker_host_drained")]

# beats and timeouts shortened so that a loss is seen within seconds (the timeouts still
# several beats long, so that a worker slowed by this busy machine is not taken for lost)
FAST = {"HOST_BEAT_S": "0.5", "HOST_LOST_AFTER_S": "4", "PART_BEAT_S": "0.5",
        "PART_SILENT_AFTER_S": "4", "JOB_HEARTBEAT_S": "0.5", "WORKER_CONCURRENCY": "3"}
START_S = 120  # a worker registering, or an engine's ranks starting, on a loaded machine


def spec(name: str, hosts: int, steps: int, **parallel) -> dict:
    """A tiny run on 2 nodes x 2 ranks with disk checkpoints every 3 steps, observing
    training anomalies only (a few steps of tiny meet some)."""
    return {"name": name, "model": {"preset": "tiny"},
            "parallel": {"nodes": 2, "procs_per_node": 2, "hosts": hosts, **parallel},
            "train": {"steps": steps, "micro_batch": 2, "seq_len": 64, "eval_every": 0,
                      "threads": 1, "trace_every": 0},
            "checkpoint": {"every": 3},
            "faults": {"policy": {"actions": {kind: ["observe"] for kind in TRAINING_ANOMALIES}}}}


def submit(user, data: dict) -> Job:
    with transaction.atomic():
        job = Job.objects.create(name=data["name"], owner=user, spec=data)
        dispatch(job)
    return job


def state(job: Job) -> str:
    job.refresh_from_db()
    return job.state


def placed_on(job: Job) -> list[str]:
    job.refresh_from_db()
    return [r.host.name for r in job.placement]


def losses(job: Job) -> list[tuple[int, float]]:
    return list(MetricPoint.objects.filter(job=job, name="loss").order_by("step")
                .values_list("step", "value"))


def finished(job: Job, eventually, cluster, timeout: float) -> None:
    eventually(lambda: state(job) in (State.COMPLETED, State.FAILED, State.CANCELLED), timeout,
               lambda: f"job {job.pk} finishes: {diagnosis(job, cluster)}")
    assert job.state == State.COMPLETED, job.error


def diagnosis(job: Job, cluster) -> str:
    job.refresh_from_db()
    hosts = [(h.name, h.state, h.slots) for h in Host.objects.all()]
    logs = "\n".join(f"--- {h.name}\n{cluster.log_tail(h.index, 1500)}" for h in cluster.hosts)
    return (f"{job.state} on {placed_on(job)} ({job.waiting_reason}); hosts {hosts}; "
            f"{job.error}\n{logs}")


@pytest.fixture
def cluster_of(host_cluster, eventually):
    """cluster_of(n, slots) -> the cluster, its n hosts registered and up."""
    def make(n: int, slots: int, **env: str):
        cluster = host_cluster(n, WORKER_SLOTS=str(slots), **FAST, **env)
        names = {host.name for host in cluster.hosts}
        eventually(lambda: names <= set(Host.objects.up().values_list("name", flat=True)),
                   START_S, "the hosts register: " + cluster.log_tail(0))
        return cluster
    return make


def test_a_two_host_job_trains_the_losses_of_the_same_layout_on_one_host(
        cluster_of, user, eventually):
    cluster = cluster_of(3, slots=4)
    two = submit(user, spec("two-hosts", hosts=2, steps=6))
    one = submit(user, spec("one-host", hosts=1, steps=6))
    for job in (two, one):
        finished(job, eventually, cluster, 90)
    hosts_of_two = {r.host.name for r in Reservation.objects.filter(job=two)}
    assert len(hosts_of_two) == 2
    assert [s for s, _ in losses(two)] == list(range(1, 7))
    for (_, a), (_, b) in zip(losses(two), losses(one), strict=True):
        assert math.isclose(a, b, rel_tol=1e-4)


@pytest.mark.parametrize("lost", ["other", "lead"])
def test_a_lost_host_moves_the_job_to_the_survivor_and_its_return_grows_it_back(
        cluster_of, user, eventually, lost):
    cluster = cluster_of(2, slots=2)
    steps = 24
    job = submit(user, spec(f"lose-{lost}", hosts=2, steps=steps, min_hosts=1))
    eventually(lambda: len(placed_on(job)) == 2 and state(job) == State.RUNNING, START_S,
               "the job runs on both hosts")
    eventually(lambda: find_latest_good(checkpoint_folder(job))[0] is not None, START_S,
               "a checkpoint written whole")
    gone = placed_on(job)[0 if lost == "lead" else 1]
    victim = next(h.index for h in cluster.hosts if h.name == gone)
    cluster.kill(victim)

    eventually(lambda: placed_on(job) == [cluster.hosts[1 - victim].name]
               and state(job) == State.RUNNING, START_S,
               lambda: "the job runs on the survivor: " + diagnosis(job, cluster))
    loss = JobEvent.objects.filter(job=job, cause=Cause.HOST_LOSS).get()
    assert gone in loss.message
    cluster.start(victim)  # the host comes back: the job grows at its next checkpoint
    eventually(lambda: len(placed_on(job)) == 2, START_S,
               lambda: "the job grows back to two hosts: " + diagnosis(job, cluster))
    finished(job, eventually, cluster, 90)

    assert [s for s, _ in losses(job)] == list(range(1, steps + 1))  # each step stored once
    survivor = cluster.hosts[1 - victim].name
    shrink, grow = (e.data for e in Event.objects.filter(job=job, type="membership")
                    .order_by("seq"))
    assert (set(shrink["hosts_before"]), shrink["hosts_after"], shrink["world_size"]) == (
        {gone, survivor}, [survivor], 2)
    assert (grow["hosts_before"], set(grow["hosts_after"]), grow["world_size"]) == (
        [survivor], {gone, survivor}, 4)
    assert Event.objects.filter(job=job, type="anomaly", data__kind="host_lost").count() == 1


def test_a_lost_host_costs_the_steps_since_the_last_memory_snapshot_held_by_its_peer(
        cluster_of, user, eventually):
    cluster = cluster_of(2, slots=2)
    steps = 30
    data = spec("lose-memory", hosts=2, steps=steps, min_hosts=1, scale_up=False)
    data["checkpoint"] = {"every": 12, "memory_every": 4}  # memory 4, 8, 16, 20; disk 12, 24
    job = submit(user, data)

    def after(step: int) -> bool:
        return Event.objects.filter(job=job, type="step", step__gte=step).exists()
    eventually(lambda: after(19), START_S, lambda: "step 19: " + diagnosis(job, cluster))
    cluster.kill(1)  # 3 steps after the memory snapshot at 16 (or just after the one at 20)
    # its RAM goes with a real host; an emulated one's memory tier stays in the shared /dev/shm
    shutil.rmtree(memory_dir(checkpoint_folder(job), cluster.hosts[1].name))
    eventually(lambda: placed_on(job) == [cluster.hosts[0].name] and after(steps), START_S,
               lambda: "the job runs on the survivor: " + diagnosis(job, cluster))
    finished(job, eventually, cluster, 90)

    saves = Event.objects.filter(job=job, type="checkpoint").order_by("seq")
    membership = Event.objects.get(job=job, type="membership")
    newest = saves.filter(seq__lt=membership.seq).last().data
    assert (newest["tier"], newest["step"] in (16, 20)) == ("memory", True)
    resumed = Event.objects.filter(job=job, type="step", seq__gt=membership.seq).first()
    assert resumed.step == newest["step"] + 1  # not 13, after the disk checkpoint at 12
    assert [s for s, _ in losses(job)] == list(range(1, steps + 1))  # each step stored once


def test_two_jobs_for_one_hosts_slots_never_share_one_and_run_one_after_the_other(
        cluster_of, user, eventually):
    cluster = cluster_of(1, slots=4)
    first = submit(user, spec("first", hosts=1, steps=3))
    second = submit(user, spec("second", hosts=1, steps=3))
    eventually(lambda: Job.objects.filter(pk=second.pk).exclude(waiting_reason="").exists()
               or state(second) != State.QUEUED, START_S, "the second job waits or runs")
    for job in (first, second):
        finished(job, eventually, cluster, 90)
    a, b = (Reservation.objects.get(job=job) for job in (first, second))
    assert a.released_at <= b.created_at  # the second was placed once the first let go
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.finished_at <= second.started_at


def test_a_job_asking_for_more_hosts_than_are_up_waits_and_runs_once_they_register(
        cluster_of, user, eventually):
    cluster = cluster_of(3, slots=1)
    data = spec("five", hosts=5, steps=3)
    data["parallel"].update(nodes=5, procs_per_node=1)
    job = submit(user, data)
    eventually(lambda: Job.objects.get(pk=job.pk).waiting_reason, 30, "a reason to wait")
    job.refresh_from_db()
    assert job.state == State.QUEUED
    assert job.waiting_reason == "needs 5 hosts; 3 are up"
    cluster.grow(2)  # two more hosts register
    finished(job, eventually, cluster, 90)
    assert Reservation.objects.filter(job=job).values("host").distinct().count() == 5
