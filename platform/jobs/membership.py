"""The hosts of a running job and what happens when one goes: every host's part of an
incarnation (the lead's supervisor, each other host's `run_part` task) beats its reservation
every PART_BEAT_S and watches the others'; a peer silent for PART_SILENT_AFTER_S (or one that
never beat within PART_START_TIMEOUT_S of its placement) is a lost host. Whoever sees it first
requeues the job (`lose_hosts`: one transaction, so only one of them can), marking the host
lost so placement passes it over until it beats again; every part then finds its incarnation
over and stops its engine, and the scheduler places the job anew, on fewer hosts if
`parallel.min_hosts` allows, resharded from the newest checkpoint.

A new incarnation whose hosts differ from the previous one's says so before its engine
starts: a `membership` event (and a `host_lost` anomaly when a host was lost), published into
the job's event stream like the engine's own, so they are stored once and charted.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from engine.contract import AnomalyEvent, AnomalyKind, MembershipEvent
from engine.runtime.events import EventLog
from engine.runtime.spec import layout_on_hosts, parse_spec
from hosts import registry
from hosts.models import Host
from jobs import placement
from jobs.dispatch import dispatch
from jobs.launch import HostShare
from jobs.models import SUPERVISED, Cause, IllegalTransition, Job, JobEvent, Reservation, S

log = logging.getLogger(__name__)


def incarnation_spec(job: Job, hosts_now: int) -> dict:
    """The spec this incarnation runs: the job's own, laid out on the hosts it holds now (the
    global batch kept)."""
    if hosts_now == int(job.spec.get("parallel", {}).get("hosts", 1)):
        return job.spec
    return layout_on_hosts(job.spec, hosts_now)


def held(job: Job, incarnation: int) -> list[Reservation]:
    """The reservations of one incarnation, lead first."""
    return list(Reservation.objects.filter(job=job, incarnation=incarnation, released_at=None)
                .select_related("host").order_by("node_rank"))


def share(job: Job, incarnation: int, node_rank: int, endpoint: str) -> HostShare:
    reservations = held(job, incarnation)
    mine = next(r for r in reservations if r.node_rank == node_rank)
    return HostShare(node_rank=node_rank, nnodes=len(reservations), endpoint=endpoint,
                     run_id=f"job{job.pk}-{incarnation}", address=mine.host.address,
                     slots=tuple(mine.slots),
                     gpus=bool(mine.host.devices.get("gpus")))


class Peers:
    """One host's view of the incarnation it runs a part of."""

    def __init__(self, job: Job, incarnation: int, node_rank: int):
        self.job, self.incarnation, self.node_rank = job, incarnation, node_rank
        self.placed_at = timezone.now()

    def beat(self) -> bool:
        """Beat this host's reservation; False once it was released (the job moved on)."""
        return bool(Reservation.objects.filter(
            job=self.job, incarnation=self.incarnation, node_rank=self.node_rank,
            released_at=None).update(beat_at=timezone.now()))

    def current(self) -> bool:
        """Whether the job still runs this incarnation."""
        return Job.objects.filter(pk=self.job.pk, incarnation=self.incarnation,
                                  state__in=SUPERVISED).exists()

    def silent(self) -> list[str]:
        """The hosts of the other parts that stopped beating (or never started)."""
        now = timezone.now()
        quiet = now - timedelta(seconds=settings.PART_SILENT_AFTER_S)
        never = now - timedelta(seconds=settings.PART_START_TIMEOUT_S)
        lost = []
        for r in held(self.job, self.incarnation):
            if r.node_rank == self.node_rank:
                continue
            if (r.beat_at is not None and r.beat_at < quiet) or (
                    r.beat_at is None and self.placed_at < never):
                lost.append(r.host.name)
        return lost


def lose_hosts(job: Job, incarnation: int, hosts: list[str], reason: str) -> bool:
    """Requeue `job` without `hosts` (lost: placement passes them over until they beat
    again); False when the incarnation had already ended (another host saw it first)."""
    with transaction.atomic():
        current = Job.objects.select_for_update().get(pk=job.pk)
        if current.incarnation != incarnation or current.state not in SUPERVISED:
            return False
        Host.objects.filter(name__in=hosts).update(lost_at=timezone.now())
        placement.release(current)
        try:
            current.requeue(Cause.HOST_LOSS, f"{reason}; resuming on the other hosts from the "
                            "newest checkpoint")
        except IllegalTransition:
            return False
        dispatch(current)
    log.warning("job %s: lost host(s) %s (%s); requeued", job.pk, ", ".join(hosts), reason)
    return True


def exclude(job: Job, incarnation: int, rank: int) -> str:
    """The fault policy excludes `rank`, a persistent straggler: drain the host that runs it
    (the job then moves off it: `regroup_reason`); why, or "" when no host of this
    incarnation runs that rank."""
    reservations = held(job, incarnation)
    node_rank = rank // parse_spec(incarnation_spec(job, len(reservations))).parallel.ranks_per_host
    host = next((r.host for r in reservations if r.node_rank == node_rank), None)
    if host is None:
        return ""
    registry.set_drained(host, True, actor="fault policy")
    return f"host {host.name} drained: its rank {rank} stayed a straggler after rebalancing"


def regroup_reason(job: Job, incarnation: int) -> str:
    """Why the running job should move to other hosts at its next checkpoint, or "": a host it
    runs on was drained, or it runs on fewer hosts than it asked for, `parallel.scale_up` is on
    and placement would give it more now."""
    names = [r.host.name for r in held(job, incarnation) if r.host.drained]
    if names:
        return f"host(s) {', '.join(names)} drained"
    parallel = job.spec.get("parallel", {})
    wanted, now = int(parallel.get("hosts", 1)), len(held(job, incarnation))
    if parallel.get("scale_up", True) and now < wanted and _could_grow(job, wanted):
        return f"scaling back up from {now} to {wanted} hosts"
    return ""


def _could_grow(job: Job, wanted: int) -> bool:
    """Whether `wanted` up hosts would have the slots the job needs on each, counting the
    slots it holds now as its own."""
    hosts = list(Host.objects.up())
    free = placement.free_slots(hosts)
    own = {r.host_id: len(r.slots) for r in held(job, job.incarnation)}
    need = placement.shape(job).slots
    return sum(len(free[h.pk]) + own.get(h.pk, 0) >= need for h in hosts) >= wanted


def regroup(job: Job, reason: str) -> None:
    """The job paused to move (see `regroup_reason`): queue it to be placed anew."""
    with transaction.atomic():
        job.transition(S.QUEUED, Cause.SCHEDULER, message=f"{reason}: placed anew from the "
                       "checkpoint it just wrote", expect=frozenset({S.PAUSED}))
        dispatch(job)


def announce(job: Job, events_path: Path) -> None:
    """Publish the membership change into the job's events, before this incarnation's engine
    starts (nothing else writes them then): which hosts it ran on, which it runs on now, and
    why (the move that requeued it)."""
    if job.incarnation <= 1:
        return
    before = [r.host.name for r in Reservation.objects.filter(
        job=job, incarnation=job.incarnation - 1).select_related("host").order_by("node_rank")]
    after = [r.host.name for r in held(job, job.incarnation)]
    if not before or before == after:
        return
    requeue = (JobEvent.objects.filter(job=job, to_state="queued").order_by("-id").first())
    reason = requeue.message if requeue else "placed anew"
    world = parse_spec(incarnation_spec(job, len(after))).parallel.world_size
    events = EventLog(str(job.pk), events_path, settings.REDIS_URL)
    try:
        if requeue is not None and requeue.cause == Cause.HOST_LOSS:
            events.emit(AnomalyEvent(step=job.step, kind=AnomalyKind.HOST_LOST, severity="error",
                                     evidence={"lost": sorted(set(before) - set(after)),
                                               "reason": reason}))
        events.emit(MembershipEvent(step=job.step, hosts_before=before, hosts_after=after,
                                    world_size=world, reason=reason))
    finally:
        events.close()
