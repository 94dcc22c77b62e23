"""A running job's hosts (jobs.membership): each part's beat and its view of the others, the
loss of a host (requeued once, whoever sees it first; the host passed over until it beats
again), moving at the next checkpoint when a host is drained or room to grow back appears,
the spec an incarnation runs, and the membership event a new incarnation publishes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine.runtime.events import read_events
from hosts.models import Host
from hosts.registry import beat
from jobs.launch import run_dir
from jobs.membership import (
    Peers,
    announce,
    exclude,
    incarnation_spec,
    lose_hosts,
    regroup_reason,
    share,
)
from jobs.models import Cause, Job, State
from jobs.placement import place
from tests.platform.jobs.test_placement import host, job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("session_worker_host_hidden")]


@pytest.fixture
def running(user) -> Job:
    """A job on two hosts (one node of two ranks each), started and running."""
    for name in ("a", "b", "c"):
        host(name, slots=2)
    made = job(user, hosts=2, min_hosts=1)
    made.spec["train"] = {"micro_batch": 2}
    made.save()
    place(made)
    made.refresh_from_db()
    made.start(supervisor="test")
    made.mark_running()
    return made


def test_each_part_beats_its_own_reservation_and_sees_a_silent_peer(running, settings):
    settings.PART_SILENT_AFTER_S = 5
    lead, other = running.placement
    mine = Peers(running, running.incarnation, 0)
    theirs = Peers(running, running.incarnation, 1)
    assert mine.beat() and theirs.beat() and mine.current()
    assert mine.silent() == [] and theirs.silent() == []

    other.beat_at = timezone.now() - timedelta(seconds=6)
    other.save()
    assert mine.silent() == [other.host.name]
    assert theirs.silent() == []  # a part does not judge itself


def test_a_peer_that_never_starts_is_lost_after_the_start_timeout(running, settings):
    settings.PART_START_TIMEOUT_S = 30
    mine = Peers(running, running.incarnation, 0)
    assert mine.silent() == []
    mine.placed_at -= timedelta(seconds=31)
    assert mine.silent() == [running.placement[1].host.name]


def test_a_lost_host_requeues_the_job_once_and_is_passed_over_until_it_beats(running):
    lost = running.placement[1].host
    assert lose_hosts(running, running.incarnation, [lost.name], "b stopped beating")
    # the other part saw it too: the incarnation is over already
    assert not lose_hosts(running, running.incarnation, [lost.name], "b stopped beating")
    running.refresh_from_db()
    assert running.state == State.QUEUED and running.placement == []
    event = running.transitions.last()
    assert (event.cause, event.message) == (
        Cause.HOST_LOSS, "b stopped beating; resuming on the other hosts from the newest "
        "checkpoint")
    assert lost.name not in Host.objects.up().values_list("name", flat=True)
    beat(Host.objects.get(name=lost.name))  # alive after all: it beats, and is up again
    assert lost.name in Host.objects.up().values_list("name", flat=True)


def test_the_survivors_run_the_spec_laid_out_on_fewer_hosts_with_the_global_batch(running):
    lead = running.placement[0].host
    lose_hosts(running, running.incarnation, [running.placement[1].host.name], "lost")
    Host.objects.exclude(pk=lead.pk).update(drained=True)
    running.refresh_from_db()
    assert [r.host.name for r in place(running)] == [lead.name]
    running.refresh_from_db()
    spec = incarnation_spec(running, 1)
    assert spec["parallel"]["nodes"] == 1 and spec["parallel"]["hosts"] == 1
    assert spec["train"]["micro_batch"] * spec["train"]["grad_accum"] * 2 == 2 * 1 * 4
    assert incarnation_spec(running, 2) == running.spec  # on every host it asked: as it is
    assert share(running, running.incarnation, 0, "").nnodes == 1


def test_a_drained_host_or_room_to_grow_back_moves_the_job_at_its_next_checkpoint(running):
    assert regroup_reason(running, running.incarnation) == ""
    Host.objects.filter(name=running.placement[1].host.name).update(drained=True)
    assert regroup_reason(running, running.incarnation) == (
        f"host(s) {running.placement[1].host.name} drained")

    # now on one host of the two it asked, with a third host free: it can grow back
    Host.objects.update(drained=False)
    lose_hosts(running, running.incarnation, [running.placement[1].host.name], "lost")
    Host.objects.filter(name="c").update(drained=True)
    running.refresh_from_db()
    place(running)
    running.refresh_from_db()
    assert regroup_reason(running, running.incarnation) == ""  # nowhere to grow yet
    Host.objects.filter(name="c").update(drained=False)
    assert regroup_reason(running, running.incarnation) == "scaling back up from 1 to 2 hosts"
    running.spec["parallel"]["scale_up"] = False
    assert regroup_reason(running, running.incarnation) == ""


def test_excluding_a_persistent_stragglers_rank_drains_the_host_that_runs_it(running):
    """Two hosts, one node of two ranks each: ranks 2 and 3 run on the second host."""
    second = running.placement[1].host.name
    reason = exclude(running, running.incarnation, rank=3)
    assert reason == f"host {second} drained: its rank 3 stayed a straggler after rebalancing"
    assert Host.objects.get(name=second).drained
    assert not Host.objects.get(name=running.placement[0].host.name).drained
    assert regroup_reason(running, running.incarnation) == f"host(s) {second} drained"
    assert exclude(running, running.incarnation, rank=9) == ""  # no host runs it


def test_a_new_incarnation_on_other_hosts_publishes_the_membership_change(running):
    before = [r.host.name for r in running.placement]
    lose_hosts(running, running.incarnation, [before[1]], "b stopped beating")
    Host.objects.filter(name="c").update(drained=True)
    running.refresh_from_db()
    place(running)
    running.refresh_from_db()
    path = run_dir(running) / "events.jsonl"
    announce(running, path)
    anomaly, membership = read_events(path)[-2:]
    assert (anomaly["type"], anomaly["kind"], anomaly["evidence"]["lost"]) == (
        "anomaly", "host_lost", [before[1]])
    assert (membership["type"], membership["hosts_before"], membership["hosts_after"],
            membership["world_size"]) == ("membership", before, [before[0]], 2)
