"""Gang placement (jobs.placement): all of a job's hosts or none, disjoint slots, waiting
reasons, ordering with aging and backfill, release and the orphan reaper, and placements made
at once never sharing a slot."""

from __future__ import annotations

import threading
from datetime import timedelta
from functools import partial

import pytest
from django.db import connection
from django.utils import timezone

from hosts.models import Host
from jobs.models import Cause, Job, Quota, Reservation, State
from jobs.placement import hosts_wanted, place, release, release_orphans, schedule

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("session_worker_host_drained")]


def host(name: str, slots: int = 4, *, beat_s_ago: float = 0, drained: bool = False) -> Host:
    return Host.objects.create(name=name, address=f"10.0.0.{Host.objects.count() + 1}",
                               slots=slots, drained=drained,
                               beat_at=timezone.now() - timedelta(seconds=beat_s_ago))


def job(owner, hosts: int = 1, nodes: int | None = None, procs: int = 2, *, priority: int = 0,
        min_hosts: int | None = None, waited_s: float = 0, name: str = "t") -> Job:
    """A queued job asking `hosts` hosts, one node of `procs` ranks per host by default."""
    parallel = {"nodes": nodes or hosts, "procs_per_node": procs, "hosts": hosts}
    if min_hosts is not None:
        parallel["min_hosts"] = min_hosts
    made = Job.objects.create(name=name, owner=owner, priority=priority,
                              undispatched_since=timezone.now(),  # as jobs.dispatch marks it
                              spec={"name": name, "parallel": parallel})
    if waited_s:  # submitted that long ago (created_at is set on create, so moved after)
        Job.objects.filter(pk=made.pk).update(
            created_at=timezone.now() - timedelta(seconds=waited_s))
        made.refresh_from_db()
    return made


def held(on: Host) -> list[int]:
    return sorted(i for slots in Reservation.objects.held().filter(host=on)
                  .values_list("slots", flat=True) for i in slots)


def layout(placed: Job) -> list[tuple[int, str, list[int]]]:
    placed.refresh_from_db()
    return [(r.node_rank, r.host.name, r.slots) for r in placed.placement]


# -- one placement ----------------------------------------------------------------------------

def test_a_job_gets_every_host_it_asks_with_the_lowest_free_slots_and_stays_queued(user):
    for name, slots in (("host-a", 4), ("host-b", 4), ("host-c", 8)):
        host(name, slots)
    two = job(user, hosts=2, nodes=4, procs=1)  # 2 nodes of 1 rank per host: 2 slots each
    reservations = place(two)
    assert [(r.node_rank, r.slots) for r in reservations] == [(0, [0, 1]), (1, [0, 1])]
    # the tightest hosts that fit, so the roomy one stays whole for a bigger job
    assert layout(two) == [(0, "host-a", [0, 1]), (1, "host-b", [0, 1])]
    assert two.state == State.QUEUED and two.incarnation == 1 and two.waiting_reason == ""
    assert {r.incarnation for r in reservations} == {1}


def test_jobs_on_one_host_get_disjoint_slots(user):
    a = host("host-a", slots=8)
    first, second, third = (job(user, procs=3, name=n) for n in ("j1", "j2", "j3"))
    assert place(first) and place(second)
    assert layout(first) == [(0, "host-a", [0, 1, 2])]
    assert layout(second) == [(0, "host-a", [3, 4, 5])]
    assert place(third) is None  # 2 slots left of the 3 it needs
    assert held(a) == list(range(6))
    third.refresh_from_db()
    assert third.waiting_reason == ("needs 1 host with 3 free slots; 0 have them "
                                    "(host-a: 2 free)")


def test_all_or_nothing_a_job_that_fits_on_some_of_its_hosts_takes_none(user):
    a, b = host("host-a"), host("host-b")
    place(job(user, procs=2, name="small"))  # takes 2 slots of host-a (the tightest fit tie: name)
    big = job(user, hosts=2, procs=4, name="big")
    assert place(big) is None
    big.refresh_from_db()
    assert big.placement == [] and big.incarnation == 0 and big.state == State.QUEUED
    assert big.waiting_reason == ("needs 2 hosts with 4 free slots each; 1 has them "
                                  "(host-a: 2 free, host-b: 4 free)")
    assert held(a) == [0, 1] and held(b) == []


def test_a_job_that_can_never_fit_is_accepted_waits_with_its_reason_and_runs_when_hosts_join(
        user):
    for name in ("h1", "h2", "h3"):
        host(name)
    five = job(user, hosts=5)
    assert schedule() == []
    five.refresh_from_db()
    assert five.state == State.QUEUED and five.waiting_reason == "needs 5 hosts; 3 are up"
    host("h4"), host("h5")
    assert schedule() == [five]
    assert [name for _, name, _ in layout(five)] == ["h1", "h2", "h3", "h4", "h5"]


def test_lost_and_drained_hosts_are_not_placed_on(user):
    host("lost", beat_s_ago=31)
    host("drained", drained=True)
    one = job(user)
    assert place(one) is None
    one.refresh_from_db()
    assert one.waiting_reason == "needs 1 host; 0 are up"
    host("fresh", beat_s_ago=5)
    assert layout(one) == [] and place(one)
    assert layout(one) == [(0, "fresh", [0, 1])]


def test_a_placed_job_is_not_placed_twice(user):
    host("host-a", slots=8)
    one = job(user)
    assert place(one) and place(one) is None
    assert Reservation.objects.held().count() == 1 and schedule() == []


# -- fewer hosts after a loss -----------------------------------------------------------------

def test_a_first_placement_needs_all_its_hosts_a_job_that_ran_may_take_fewer(user):
    host("h1"), host("h2")
    three = job(user, hosts=3, min_hosts=2)
    assert hosts_wanted(three) == (3, 3)
    assert place(three) is None
    Job.objects.filter(pk=three.pk).update(incarnation=1)  # it ran before, then lost hosts
    three.refresh_from_db()
    assert hosts_wanted(three) == (2, 3)
    assert place(three) and len(three.placement) == 2 and three.incarnation == 2
    host("h3")  # a later placement takes as many as there are, up to `hosts`
    release(three)
    assert place(three) and len(three.placement) == 3


def test_a_job_that_ran_and_cannot_get_min_hosts_waits_for_hosts_then_is_queued_when_placed(
        user):
    a = host("h1")
    two = job(user, hosts=2, min_hosts=2)
    Job.objects.filter(pk=two.pk).update(incarnation=1)
    assert schedule() == []
    two.refresh_from_db()
    assert two.state == State.WAITING_FOR_HOSTS
    assert two.waiting_reason == "needs 2 hosts; 1 is up"
    last = two.transitions.last()
    assert (last.to_state, last.cause, last.message) == (
        State.WAITING_FOR_HOSTS, Cause.SCHEDULER, "needs 2 hosts; 1 is up")
    host("h2")
    assert schedule() == [two]
    two.refresh_from_db()
    assert two.state == State.QUEUED and two.incarnation == 2 and two.waiting_reason == ""
    assert [r.host for r in two.placement] == [a, Host.objects.get(name="h2")]
    assert two.transitions.last().message == "placed on h1, h2"


# -- order: priority, submission, aging, backfill ---------------------------------------------

def test_higher_priority_first_then_earlier_submission(user):
    host("host-a", slots=2)
    early = job(user, name="early")
    late_high = job(user, priority=5, name="late-high")
    later = job(user, name="later")
    assert schedule() == [late_high]
    late_high.fail("done")  # a final job holds no slots
    assert schedule() == [early]
    later.refresh_from_db()
    assert later.waiting_reason.startswith("needs 1 host with 2 free slots; 0 have them")


def test_aging_lets_a_long_waiting_job_pass_a_higher_priority(user, settings):
    settings.SCHEDULER_AGING_S = 100
    host("host-a", slots=2)
    old = job(user, waited_s=250, name="old")  # effective priority 2.5
    new = job(user, priority=2, name="new")
    assert schedule() == [old]
    new.refresh_from_db()
    assert new.placement == []


def test_backfill_a_job_that_does_not_fit_does_not_block_a_smaller_one(user):
    host("host-a", slots=4)
    place(job(user, procs=2, name="running"))
    big = job(user, procs=4, priority=10, name="big")
    small = job(user, procs=2, name="small")
    assert schedule() == [small]
    big.refresh_from_db()
    assert big.waiting_reason.startswith("needs 1 host with 4 free slots")


def test_a_starving_job_holds_back_backfill_until_it_is_placed(user, settings):
    settings.SCHEDULER_AGING_S = 60
    host("host-a", slots=4)
    running = job(user, procs=2, name="running")
    place(running)
    big = job(user, procs=4, waited_s=61, name="big")  # would fit were host-a empty
    small = job(user, procs=2, name="small")
    assert schedule() == []
    small.refresh_from_db()
    assert small.waiting_reason == f"waits behind job {big.pk}, which has waited longest"
    running.fail("done")  # its slots go back (a final job holds none)
    assert schedule() == [big]


def test_a_job_that_can_never_fit_never_holds_back_others(user, settings):
    settings.SCHEDULER_AGING_S = 60
    host("host-a", slots=4)
    job(user, hosts=3, waited_s=600, name="huge")
    small = job(user, procs=2, name="small")
    assert schedule() == [small]


# -- release and the reaper -------------------------------------------------------------------

def test_release_frees_a_jobs_slots_or_only_those_on_one_host(user):
    a, b = host("host-a"), host("host-b")
    two = job(user, hosts=2)
    place(two)
    assert release(two, host=b) == 1
    assert held(a) == [0, 1] and held(b) == []
    assert release(two) == 1 and release(two) == 0
    assert held(a) == []


def test_a_final_paused_or_requeued_job_holds_no_slots(user):
    a = host("host-a", slots=8)
    done, paused, requeued = (job(user, name=n) for n in ("done", "paused", "requeued"))
    for j in (done, paused, requeued):
        place(j)
        j.start(supervisor="test")
        j.mark_running()
    assert len(held(a)) == 6
    done.begin_completing()
    done.complete()
    paused.request_pause(Cause.USER, "ada")
    paused.mark_paused("checkpointed")
    requeued.requeue(Cause.WORKER_LOSS, "supervisor lost")
    assert held(a) == []
    assert place(requeued) and layout(requeued) == [(0, "host-a", [0, 1])]


def test_the_reaper_releases_orphans_and_leaves_live_placements(user, settings):
    settings.JOB_PLACEMENT_START_TIMEOUT_S = 60
    a = host("host-a", slots=16)
    final, stale, unstarted, fresh, started = (
        job(user, name=n) for n in ("final", "stale", "unstarted", "fresh", "started"))
    for j in (final, stale, unstarted, fresh, started):
        place(j)
    started.start(supervisor="test")
    # what a crash between two writes can leave behind: a final job's reservation, one of an
    # earlier incarnation, a placement whose supervisor never started it
    Job.objects.filter(pk=final.pk).update(state=State.CANCELLED)
    Job.objects.filter(pk=stale.pk).update(incarnation=2)
    long_ago = timezone.now() - timedelta(seconds=61)
    Reservation.objects.filter(job__in=[unstarted, started]).update(created_at=long_ago)
    assert release_orphans() == 3
    assert release_orphans() == 0
    live = Reservation.objects.held()
    assert sorted(live.values_list("job__name", flat=True)) == ["fresh", "started"]
    assert len(held(a)) == 4
    assert schedule() == [stale, unstarted]  # placed again, as new incarnations


def test_the_reaper_does_not_report_a_job_that_waits_for_hosts_as_sent(user, settings):
    from jobs.tasks import reap

    settings.JOB_REAPER_INTERVAL_S = 0
    host("host-a", slots=2)
    waiting = job(user, hosts=2, waited_s=600)  # needs two hosts: stays queued, unplaced
    assert reap() == [] and reap() == []
    assert Job.objects.get(pk=waiting.pk).undispatched_since is not None  # still the queue's


# -- concurrent placements --------------------------------------------------------------------

def _at_once(*calls) -> list:
    """Run each call in a thread of its own, released together; their results in order."""
    start = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i: int, call) -> None:
        try:
            start.wait()
            results[i] = call()
        finally:
            connection.close()  # each thread's own database connection

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


@pytest.mark.django_db(transaction=True)
def test_two_jobs_placed_at_once_onto_slots_for_one_never_share_a_slot(user):
    a = host("host-a", slots=4)
    for round_ in range(5):
        first, second = job(user, procs=4, name=f"a{round_}"), job(user, procs=4, name=f"b{round_}")
        results = _at_once(partial(place, first), partial(place, second))
        assert sum(r is not None for r in results) == 1, results
        assert held(a) == [0, 1, 2, 3]
        winner = first if results[0] is not None else second
        release(winner)
        winner.fail("done")
        assert place(second if winner is first else first)  # the other runs after it
        Job.objects.filter(state=State.QUEUED).update(state=State.CANCELLED)
        release_orphans()


@pytest.mark.django_db(transaction=True)
def test_two_schedulers_at_once_place_each_job_once(user):
    a, b = host("host-a", slots=4), host("host-b", slots=4)
    jobs = [job(user, procs=2, name=f"j{i}") for i in range(5)]
    results = _at_once(schedule, schedule)
    placed = [j.pk for r in results for j in r]
    assert len(placed) == len(set(placed)) == 4
    assert held(a) == held(b) == [0, 1, 2, 3]
    for j in jobs:
        j.refresh_from_db()
    assert sorted(j.incarnation for j in jobs) == [0, 1, 1, 1, 1]


# -- the API ----------------------------------------------------------------------------------

def test_the_api_takes_a_priority_and_shows_placement_and_waiting_reason(api, small_spec,
                                                                         settings):
    settings.RINGSIDE_MAX_USER_PRIORITY = 7  # a user's cap (jobs.admission)
    created = api.post("/api/jobs/", {**small_spec, "priority": 7}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert (body["priority"], body["placement"], body["waiting_reason"]) == (7, [], "")
    host("host-a"), host("host-b")
    queued = Job.objects.get(pk=body["id"])
    Job.objects.filter(pk=queued.pk).update(spec={**queued.spec, "parallel": {
        **queued.spec["parallel"], "nodes": 2, "hosts": 2}})
    place(queued)
    where = [{"node_rank": 0, "host": "host-a", "slots": [0]},
             {"node_rank": 1, "host": "host-b", "slots": [0]}]
    assert api.get(f"/api/jobs/{queued.pk}/").json()["placement"] == where
    assert api.get("/api/jobs/").json()["results"][0]["placement"] == where


@pytest.mark.parametrize("priority", [101, -101, "high"])
def test_a_bad_priority_is_a_400_naming_it(api, small_spec, priority):
    answer = api.post("/api/jobs/", {**small_spec, "priority": priority}, format="json")
    assert answer.status_code == 400
    assert set(answer.json()["errors"]) == {"priority"}


def test_a_job_waiting_for_hosts_is_cancelled_at_once_and_a_placed_one_frees_its_slots(user):
    a = host("host-a")
    waiting, placed = job(user, hosts=2, name="waiting"), job(user, name="placed")
    Job.objects.filter(pk=waiting.pk).update(incarnation=1)
    waiting.refresh_from_db()
    assert schedule() == [placed]
    waiting.refresh_from_db()
    assert waiting.state == State.WAITING_FOR_HOSTS
    for j in (waiting, placed):
        j.request_cancel(Cause.USER, "ada")
        assert j.state == State.CANCELLED
    assert held(a) == []


def test_a_job_over_its_owners_slot_quota_waits_saying_so_and_holds_no_one_back(
        user, other_user, settings, session_worker_host_drained):
    settings.SCHEDULER_AGING_S = 60
    Quota.objects.create(user=user, slots=3)
    host("host-a", slots=8)
    first = job(user, procs=2, name="first")
    assert place(first) is not None
    second = job(user, procs=2, name="second", waited_s=10 * settings.SCHEDULER_AGING_S)
    others = job(other_user, procs=2, name="others")
    assert schedule() == [others]  # the second waits; the aged one does not starve the pass
    second.refresh_from_db()
    assert second.placement == []
    assert second.waiting_reason == ("waits for its owner's slot quota: their jobs hold 2 of "
                                     "3 slots and this one needs 2")
    release(first)  # its slots are free again: the second goes
    assert schedule() == [second]
