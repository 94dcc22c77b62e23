"""Gang placement: which hosts, and which slots on them, each queued job gets.

A job asks for `parallel.hosts` hosts (its nodes spread evenly over them), each with
`nodes / hosts * procs_per_node` free slots; a job that has run before (incarnation > 0) may be
placed on fewer, down to `parallel.min_hosts` (`hosts_wanted`). It gets all of them or none:
`place` locks the up hosts' rows (SELECT ... FOR UPDATE, in primary-key order so that two
placements cannot deadlock), counts the slots their held reservations take, and creates one
`Reservation` per chosen host with explicit slot indices, all in one transaction. Two
schedulers, or two jobs placed at once, therefore never hold the same slot.

`schedule` places waiting jobs in order: effective priority first (`priority` plus one for
every SCHEDULER_AGING_S seconds the job has waited, so that none starves), then submission.
Backfill: a job that does not fit does not stop the pass, so a smaller one behind it may be
placed, except behind a *starving* job, one that has waited at least SCHEDULER_AGING_S and
would fit were the up hosts empty: the pass places nothing after it, so the slots that
finishing jobs free go to it first. A job that could not fit even on empty hosts never holds
others back; it stays queued with its reason (it is not failed: hosts may register later).
Nor does one that would take its owner past their slot quota (jobs.models.Quota): it waits,
saying so, until their other jobs free slots.

Only jobs on the `hosts` backend are placed here (Slurm places its own: jobs.backends.slurm).
The placed job keeps its state (queued); its supervisor task moves it on (`Job.start`). A job
that has run and cannot get even `min_hosts` hosts waits in `waiting_for_hosts` and returns
to queued when it is placed again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, Max, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from engine.runtime.spec import parse_spec
from hosts.models import Host
from jobs.models import UNPLACED, Cause, Job, JobEvent, Quota, Reservation, State

# the states placement takes jobs from
WAITING = (State.QUEUED, State.WAITING_FOR_HOSTS)


@dataclass(frozen=True)
class Shape:
    """What one placement of a job needs: between `fewest` and `most` hosts, each with
    `slots` free slots (one per rank it runs there)."""

    fewest: int
    most: int
    slots: int


def hosts_wanted(job: Job) -> tuple[int, int]:
    """(fewest, most) hosts the job may be placed on: `parallel.hosts` for a first placement;
    a job that has run may continue on fewer, down to `parallel.min_hosts`."""
    parallel = job.spec.get("parallel", {})
    hosts = int(parallel.get("hosts", 1))
    if job.incarnation == 0:
        return hosts, hosts
    return min(int(parallel.get("min_hosts", hosts)), hosts), hosts


def shape(job: Job) -> Shape:
    fewest, most = hosts_wanted(job)
    return Shape(fewest, most, parse_spec(job.spec).parallel.ranks_per_host)


def free_slots(hosts: list[Host]) -> dict[int, list[int]]:
    """Each host's free slot indices (by host pk), lowest first: those its held reservations
    do not name."""
    held: dict[int, set[int]] = {host.pk: set() for host in hosts}
    for host_id, slots in Reservation.objects.held().filter(host__in=hosts).values_list(
            "host_id", "slots"):
        held[host_id].update(slots)
    return {host.pk: [i for i in range(host.slots) if i not in held[host.pk]] for host in hosts}


def waiting_reason(need: Shape, hosts: list[Host], free: dict[int, list[int]]) -> str:
    """Why the job does not fit, e.g. "needs 2 hosts with 4 free slots each; 1 has them
    (host-a: 4 free, host-b: 2 free)" or "needs 5 hosts; 3 are up"."""
    count = f"{need.fewest}" if need.fewest == need.most else f"at least {need.fewest}"
    plural = "s" if need.fewest > 1 else ""
    if len(hosts) < need.fewest:
        return f"needs {count} host{plural}; {len(hosts)} {'is' if len(hosts) == 1 else 'are'} up"
    having = sum(len(free[host.pk]) >= need.slots for host in hosts)
    listing = ", ".join(f"{host.name}: {len(free[host.pk])} free" for host in hosts)
    each = " each" if need.fewest > 1 else ""
    return (f"needs {count} host{plural} with {need.slots} free slot"
            f"{'s' if need.slots > 1 else ''}{each}; {having} "
            f"{'has' if having == 1 else 'have'} them ({listing})")


def _choose(need: Shape, hosts: list[Host], free: dict[int, list[int]]) -> list[Host]:
    """Up to `most` hosts that have the slots, tightest fit first (the roomier hosts stay
    whole for bigger jobs); empty when fewer than `fewest` have them."""
    fitting = sorted((host for host in hosts if len(free[host.pk]) >= need.slots),
                     key=lambda host: (len(free[host.pk]), host.name))
    return fitting[:need.most] if len(fitting) >= need.fewest else []


def place(job: Job) -> list[Reservation] | None:
    """Place a queued (or waiting_for_hosts) job on its hosts, all or nothing, in one
    transaction: its incarnation goes up by one and one reservation per host is created
    (node_rank 0 the lead). None when it does not fit (its waiting_reason says why; a job that
    has run moves to waiting_for_hosts), or when it is not waiting or already placed."""
    with transaction.atomic():
        # the job's row first, then the hosts' in pk order: every placement locks in this order
        current = Job.objects.select_for_update().get(pk=job.pk)
        if current.state not in WAITING or current.placement:
            return None
        hosts = list(Host.objects.up().select_for_update().order_by("pk"))
        need = shape(current)
        free = free_slots(hosts)
        chosen = _choose(need, hosts, free)
        reason = (waiting_reason(need, hosts, free) if not chosen
                  else slot_quota_reason(current, need.slots * len(chosen)))
        if reason:
            _wait(current, reason)
            job.refresh_from_db()
            return None
        names = ", ".join(host.name for host in chosen)
        if current.state == State.WAITING_FOR_HOSTS:
            current.transition(State.QUEUED, Cause.SCHEDULER, message=f"placed on {names}")
        Job.objects.filter(pk=job.pk).update(incarnation=F("incarnation") + 1, waiting_reason="")
        current.refresh_from_db()
        reservations = Reservation.objects.bulk_create(
            Reservation(job=current, host=host, incarnation=current.incarnation, node_rank=rank,
                        slots=free[host.pk][:need.slots])
            for rank, host in enumerate(chosen))
    job.refresh_from_db()
    return reservations


def slot_quota_reason(job: Job, slots: int) -> str:
    """Why taking `slots` more would put the job's owner over their slot quota
    (jobs.models.Quota); "" when it would not."""
    limit = Quota.limits_of(job.owner).slots
    if limit is None:
        return ""
    held = sum(len(taken) for taken in Reservation.objects.held().filter(
        job__owner_id=job.owner_id).values_list("slots", flat=True))
    if held + slots <= limit:
        return ""
    return (f"waits for its owner's slot quota: their jobs hold {held} of {limit} slots and "
            f"this one needs {slots}")


def _wait(job: Job, reason: str) -> None:
    Job.objects.filter(pk=job.pk).update(waiting_reason=reason)
    if job.incarnation > 0 and job.state == State.QUEUED:
        job.wait_for_hosts(reason)


def release(job: Job, host: Host | None = None) -> int:
    """Release the job's held reservations (only those on `host` when given, e.g. a lost
    host's); returns how many."""
    held = Reservation.objects.held().filter(job=job)
    if host is not None:
        held = held.filter(host=host)
    return held.update(released_at=timezone.now())


def release_orphans() -> int:
    """The reaper's pass: release reservations no live placement owns, so that no slot is
    held by a finished, failed, cancelled, paused or waiting job; those of an earlier
    incarnation; and those of a queued job whose supervisor has not started it within
    JOB_PLACEMENT_START_TIMEOUT_S (it is placed again). Returns how many."""
    unstarted = timezone.now() - timedelta(seconds=settings.JOB_PLACEMENT_START_TIMEOUT_S)
    orphans = Reservation.objects.held().filter(
        Q(job__state__in=UNPLACED - {State.QUEUED})
        | ~Q(incarnation=F("job__incarnation"))
        | Q(job__state=State.QUEUED, created_at__lt=unstarted, beat_at__isnull=True))
    return orphans.update(released_at=timezone.now())


def queue() -> QuerySet[Job]:
    """The jobs placement takes: dispatched (jobs.dispatch marks them undispatched until their
    supervisor task is sent) and not yet placed, each annotated with `waiting_since` (when it
    last became queued or waiting_for_hosts; its submission if never). A queued row nobody
    dispatched is not the scheduler's to run."""
    placed = Reservation.objects.held().filter(job=OuterRef("pk"),
                                               incarnation=OuterRef("incarnation"))
    since = (JobEvent.objects.filter(job=OuterRef("pk"), to_state__in=WAITING)
             .values("job").annotate(last=Max("time")).values("last"))
    return (Job.objects.filter(state__in=WAITING, cancel_requested_at__isnull=True,
                               undispatched_since__isnull=False, backend="hosts")
            .exclude(Exists(placed))
            .annotate(waiting_since=Coalesce(Subquery(since), F("created_at"))))


def effective_priority(job: Job, now: datetime) -> float:
    """`priority` plus one for every SCHEDULER_AGING_S seconds waited (`queue` annotates)."""
    waited = (now - job.waiting_since).total_seconds()
    return job.priority + max(waited, 0.0) / settings.SCHEDULER_AGING_S


def _fits_empty(need: Shape, hosts: list[Host]) -> bool:
    return sum(host.slots >= need.slots for host in hosts) >= need.fewest


def schedule() -> list[Job]:
    """One placement pass over the waiting jobs, in order (module docstring); returns the jobs
    it placed, in the order placed."""
    now = timezone.now()
    jobs = sorted(queue(), key=lambda j: (-effective_priority(j, now), j.created_at, j.pk))
    placed: list[Job] = []
    starving: Job | None = None
    for job in jobs:
        if starving is not None:
            Job.objects.filter(pk=job.pk).update(
                waiting_reason=f"waits behind job {starving.pk}, which has waited longest")
            continue
        if place(job) is not None:
            placed.append(job)
            continue
        up = list(Host.objects.up())
        aged = (now - job.waiting_since).total_seconds() >= settings.SCHEDULER_AGING_S
        # one its owner's slot quota holds back cannot take the slots others would free
        need = shape(job)
        if aged and _fits_empty(need, up) and not slot_quota_reason(job, need.slots * need.fewest):
            starving = job
    return placed
