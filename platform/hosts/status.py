"""A host as the API and the Hosts page show it: its devices, the slots its jobs hold and what
its beat says (state, age, version and clock against this platform's).

Slots held come from the jobs app's reservations (`Host.reservations`, related_name of
jobs.models.Reservation.host): read here, by the reverse relation, and nowhere else in hosts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.utils import timezone

from hosts import registry
from hosts.models import Host


def held_reservations(host: Host) -> list[Any]:
    """The host's reservations still held (released_at null), with their jobs. Uses the
    prefetch of `with_holdings` when there is one."""
    cache = getattr(host, "_prefetched_objects_cache", {})
    if "reservations" in cache:
        return [r for r in cache["reservations"] if r.released_at is None]
    return list(host.reservations.filter(released_at__isnull=True).select_related("job"))


def with_holdings(hosts):
    """`hosts` (a queryset) with their reservations and jobs read in two queries, not per
    host."""
    return hosts.prefetch_related("reservations__job")


def slots_used(host: Host) -> int:
    """Slots of the host that jobs hold now."""
    return _slots_in(held_reservations(host))


def _slots_in(held: list[Any]) -> int:
    return sum(len(r.slots) for r in held)


# what a user who is not staff sees of another user's job on a host
OTHERS_JOB = "a job of another user"


def holding(reservation: Any, viewer: Any) -> dict[str, Any]:
    """One job's hold on a host as `viewer` may see it: another user's job, to a user who is
    not staff, without its id or name."""
    if viewer.is_staff or reservation.job.owner_id == viewer.pk:
        return {"job": reservation.job_id, "name": reservation.job.name,
                "node_rank": reservation.node_rank, "slots": reservation.slots}
    return {"job": None, "name": OTHERS_JOB, "node_rank": reservation.node_rank,
            "slots": reservation.slots}


def record(host: Host, viewer: Any, now=None) -> dict[str, Any]:
    """The host's row on the Hosts page and in `/api/hosts/`, as `viewer` (a user) sees it."""
    now = now or timezone.now()
    held = held_reservations(host)
    used = _slots_in(held)
    return {
        "name": host.name, "address": host.address, "devices": host.devices,
        "labels": host.labels, "slots": host.slots, "slots_used": used,
        "slots_free": max(host.slots - used, 0), "state": host.state,
        "drained": host.drained, "beat_at": host.beat_at, "started_at": host.started_at,
        "beat_age_s": round((now - host.beat_at).total_seconds(), 3),
        "version": host.version, "version_differs": host.version != registry.version(),
        "clock_offset_s": host.clock_offset_s,
        "jobs": [holding(r, viewer) for r in held],
    }


def records(hosts: Iterable[Host], viewer: Any) -> list[dict[str, Any]]:
    now = timezone.now()
    return [record(host, viewer, now) for host in hosts]
