"""Websockets: `/ws/jobs/<id>/` (one job's telemetry) and `/ws/jobs/` (the list page).

`/ws/jobs/<id>/`: every message is JSON with `type` and `seq`. First a `snapshot` (`seq` =
`last_seq`, the newest stored event; `state`, `spec`, `job`; `series`, downsampled with the
min/max envelope; the latest `ops` and `experts` samples; the `anomalies`, `actions`,
`checkpoints`, `memberships`, `bad_batches` and `proposals` events), then the events as
published (`step`, `ops`, `experts`, `anomaly`, `action`, `checkpoint`, `membership`,
`bad_batch`, `proposal`, `state`, `log`),
in sequence order, and `{"type": "job", ...}` when the platform moves the job's state. After the
snapshot (or the replay) come the job's `commands`, `checkpoints` and `settings` as they are,
then a `command` at every move of a command's state and `checkpoints` and `settings` when they
change (monitor.pushes). The
snapshot's `goodput` is the job's goodput ledger (monitor.goodput), and a `{"type": "goodput",
"goodput": ...}` message brings it again after every stored batch of events and every state
change. A client reconnecting with `?after=<seq>` gets, instead of the snapshot, exactly the
stored events after that sequence number, then the live ones. The consumer joins the job's
group before reading the database and drops live events it already sent, so nothing falls
between the two; if live events were dropped on the way (the channel layer sheds messages for a
client too slow to take them), the gap is read back from the database before the next event is
sent, so a slow client loses nothing and slows no one.

The snapshot also holds `ops_history` and `experts_history`: the newest 300 steps' `ops` and
`experts` events, as the job page keeps them (per-rank op times only in the last 10).

`/ws/jobs/`: a `snapshot` of the user's newest jobs, then a `job` message for every state
change of a job the user may see (`seq` is the id of the state-history row).

Refusals close the handshake with a code: 4401 not authenticated, 4404 no such job or not
yours (staff may watch every job). A bad `after` is answered with an `error` message naming
it, then closed with 4400.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.db import connection, transaction

from common.sockets import CLOSE_UNAUTHENTICATED, LayerErrors
from jobs.models import Job, JobEvent
from jobs.permissions import visible_jobs
from monitor import goodput, pushes
from monitor.ingest import job_group
from monitor.messages import job_message
from monitor.models import Event
from monitor.series import experts_recent, metric_series, ops_recent, ops_sample
from monitor.signals import STAFF_GROUP, user_group

CLOSE_BAD_REQUEST = 4400
CLOSE_NOT_FOUND = 4404
SNAPSHOT_POINTS = 600  # per series: enough to draw, small enough to send at once
SNAPSHOT_FEED = 500  # newest anomalies, actions, checkpoints and memberships each
# the op and expert charts' steps (the page keeps as many); per-rank times for the heatmap's
SNAPSHOT_STEPS, SNAPSHOT_OPS_FULL = 300, 10
SNAPSHOT_JOBS = 200  # newest jobs on the list socket
REPLAY_CHUNK = 500  # stored events read per query when replaying
# the messages that are no stored events (monitor.signals, monitor.pushes, jobs.evaluations)
PUSHED = frozenset({"job", "goodput", "command", "checkpoints", "settings", "evaluation"})


class TokenAuthMiddleware:
    """`?token=<API token>` authenticates a websocket when there is no session user."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        token = _query_param(scope, "token")
        user = scope.get("user")
        if token and (user is None or not user.is_authenticated):
            scope = {**scope, "user": await _user_for_token(token)}
        return await self.inner(scope, receive, send)


@database_sync_to_async
def _user_for_token(key: str):
    from jobs.permissions import user_for_token

    return user_for_token(key)


def SessionOrTokenAuth(inner: Any) -> Any:  # noqa: N802 (named like Channels' own middleware stacks)
    return AuthMiddlewareStack(TokenAuthMiddleware(inner))


@contextmanager
def _consistent_read():
    """One transaction whose queries all see the same committed data (PostgreSQL's default
    isolation gives each query its own view; SQLite transactions are serializable anyway)."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def _query_param(scope: dict[str, Any], name: str) -> str | None:
    return parse_qs(scope.get("query_string", b"").decode()).get(name, [None])[0]


class JobConsumer(LayerErrors, AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        if not await self._may_watch(user):
            await self.close(code=CLOSE_NOT_FOUND)
            return
        after = _query_param(self.scope, "after")
        if after is not None and not after.isdigit():
            await self.accept()
            await self.send_json({"type": "error", "seq": 0,
                                  "error": "after: must be a non-negative integer sequence number"})
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        self.group = job_group(self.job_id)
        if not await self.join(self.group):
            return
        await self.accept()
        if after is None:
            snapshot = await self._snapshot()
            self.sent_seq = snapshot["seq"]
            await self.send_json(snapshot)
        else:
            self.sent_seq = int(after)
            await self._send_stored(until=None)
            # state changes and the ledger are pushed, not stored as events: one made while
            # this client was away would otherwise never reach it
            await self.send_json(await self._job_state())
            await self.send_json(await self._goodput())
        for message in await self._resync():  # pushed, not stored, like the state
            await self.send_json(message)

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.leave(self.group)

    async def receive_json(self, content: Any, **kwargs) -> None:
        await self.send_json({"type": "error", "seq": self.sent_seq,
                              "error": "this socket is read-only; steer the job through the API"})

    async def job_events(self, message: dict[str, Any]) -> None:
        """A chunk of events forwarded by the ingest (or state changes from the platform)."""
        for event in message["events"]:
            if event["type"] in PUSHED:  # not stored events: no seq of their own
                await self.send_json(event)
                continue
            if event["seq"] <= self.sent_seq:
                continue  # already in the snapshot or the replay
            if event["seq"] > self.sent_seq + 1:
                await self._send_stored(until=event["seq"])  # dropped on the way: read back
            await self.send_json(event)
            self.sent_seq = event["seq"]

    async def _send_stored(self, until: int | None) -> None:
        """Send the stored events after `sent_seq` (and before `until`), in order."""
        while chunk := await self._stored_after(self.sent_seq, until):
            for event in chunk:
                await self.send_json(event)
            self.sent_seq = chunk[-1]["seq"]

    @database_sync_to_async
    def _may_watch(self, user) -> bool:
        return visible_jobs(user).filter(pk=self.job_id).exists()

    @database_sync_to_async
    def _stored_after(self, seq: int, until: int | None) -> list[dict[str, Any]]:
        events = Event.objects.filter(job_id=self.job_id, seq__gt=seq)
        if until is not None:
            events = events.filter(seq__lt=until)
        return list(events.order_by("seq").values_list("data", flat=True)[:REPLAY_CHUNK])

    @database_sync_to_async
    def _job_state(self) -> dict[str, Any]:
        """The job's current state as the `job` message the platform pushes on a change."""
        job = Job.objects.get(pk=self.job_id)
        return job_message(job, self.sent_seq, job.transitions.last())

    @database_sync_to_async
    def _resync(self) -> list[dict[str, Any]]:
        return pushes.resync(self.job_id)

    @database_sync_to_async
    def _goodput(self) -> dict[str, Any]:
        return goodput.message(self.job_id, self.sent_seq)

    @database_sync_to_async
    def _snapshot(self) -> dict[str, Any]:
        with _consistent_read():
            job = Job.objects.get(pk=self.job_id)
            events = Event.objects.filter(job=job)
            last = events.order_by("-seq").values_list("seq", flat=True).first() or 0

            def newest(type: str) -> list[dict[str, Any]]:
                rows = events.filter(type=type).order_by("-seq")[:SNAPSHOT_FEED]
                return list(reversed(rows.values_list("data", flat=True)))

            experts = events.filter(type="experts").order_by("-seq").first()
            return {
                "type": "snapshot",
                "seq": last,
                "last_seq": last,
                "state": job.state,
                "spec": job.spec,
                "job": {"id": job.pk, "name": job.name, "state": job.state, "step": job.step,
                        "total_steps": job.total_steps, "error": job.error,
                        "started_at": job.started_at and job.started_at.isoformat()},
                "series": metric_series(job.pk, max_points=SNAPSHOT_POINTS),
                "ops": ops_sample(job.pk),
                # the live branch's steps: not those a rollback abandoned
                "ops_history": ops_recent(job.pk, SNAPSHOT_STEPS, SNAPSHOT_OPS_FULL, job.step),
                "experts_history": experts_recent(job.pk, SNAPSHOT_STEPS, job.step),
                "experts": experts.data if experts else None,
                "anomalies": newest("anomaly"),
                "actions": newest("action"),
                "checkpoints": newest("checkpoint"),
                "memberships": newest("membership"),
                "bad_batches": newest("bad_batch"),
                "proposals": newest("proposal"),
                "goodput": goodput.current(job.pk),
            }


class JobListConsumer(LayerErrors, AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.groups_joined = [STAFF_GROUP if user.is_staff else user_group(user.pk)]
        for group in self.groups_joined:
            if not await self.join(group):
                return
        await self.accept()
        await self.send_json(await self._snapshot(user))

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.leave(group)

    async def receive_json(self, content: Any, **kwargs) -> None:
        await self.send_json({"type": "error", "seq": 0, "error": "this socket is read-only"})

    async def job_state(self, message: dict[str, Any]) -> None:
        await self.send_json(message["event"])

    @database_sync_to_async
    def _snapshot(self, user) -> dict[str, Any]:
        with _consistent_read():
            jobs = visible_jobs(user)
            last = (JobEvent.objects.filter(job__in=jobs).order_by("-pk")
                    .values_list("pk", flat=True).first())
            return {"type": "snapshot", "seq": last or 0, "jobs": [
                {"id": job.pk, "name": job.name, "state": job.state, "step": job.step,
                 "total_steps": job.total_steps, "owner": job.owner.get_username()}
                for job in jobs.order_by("-created_at", "-id")[
                    :SNAPSHOT_JOBS]]}
