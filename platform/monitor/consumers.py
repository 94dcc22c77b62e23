"""Websocket `/ws/jobs/<id>/`: a snapshot of the job, then its live events.

Every message is JSON with `type` and `seq`: first `{"type": "snapshot", "seq", "job",
"series"}`, then the engine's events as published (`step`, `state`, `checkpoint`, `log`, ...)
and `{"type": "job", ...}` when the platform moves the job's state. A client reconnecting with
`?after=<seq>` gets, instead of the snapshot, exactly the stored events after that sequence
number, then the live ones. The consumer joins the job's group before reading the database
and drops live events it already sent, so nothing falls between the two.

Refusals close the handshake with a code: 4401 not authenticated, 4404 no such job or not
yours (staff may watch every job). A bad `after` is answered with an `error` message naming
it, then closed with 4400.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth.models import AnonymousUser

from jobs.models import Job
from monitor.ingest import job_group
from monitor.models import Event
from monitor.series import job_series

CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


class TokenAuthMiddleware:
    """`?token=<API token>` authenticates a websocket when there is no session user."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        token = parse_qs(scope.get("query_string", b"").decode()).get("token", [None])[0]
        user = scope.get("user")
        if token and (user is None or not user.is_authenticated):
            scope = {**scope, "user": await _user_for_token(token)}
        return await self.inner(scope, receive, send)


@database_sync_to_async
def _user_for_token(key: str):
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key).first()
    return token.user if token and token.user.is_active else AnonymousUser()


def SessionOrTokenAuth(inner):  # noqa: N802 (named like Channels' own middleware stacks)
    return AuthMiddlewareStack(TokenAuthMiddleware(inner))


class JobConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        if not await self._may_watch(user):
            await self.close(code=CLOSE_NOT_FOUND)
            return
        after = parse_qs(self.scope.get("query_string", b"").decode()).get("after", [None])[0]
        if after is not None and not after.isdigit():
            await self.accept()
            await self.send_json({"type": "error", "seq": 0,
                                  "error": "after: must be a non-negative integer sequence number"})
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        self.group = job_group(self.job_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        if after is None:
            snapshot = await self._snapshot()
            self.sent_seq = snapshot["seq"]
            await self.send_json(snapshot)
        else:
            self.sent_seq = int(after)
            for event in await self._stored_after(self.sent_seq):
                await self.send_json(event)
                self.sent_seq = event["seq"]

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs) -> None:
        await self.send_json({"type": "error", "seq": self.sent_seq,
                              "error": "this socket is read-only; steer the job through the API"})

    async def job_message(self, message: dict[str, Any]) -> None:
        event = message["message"]
        if event["type"] != "job":
            if event["seq"] <= self.sent_seq:
                return  # already in the snapshot or the replay
            self.sent_seq = event["seq"]
        await self.send_json(event)

    @database_sync_to_async
    def _may_watch(self, user) -> bool:
        jobs = Job.objects.filter(pk=self.job_id)
        return (jobs if user.is_staff else jobs.filter(owner=user)).exists()

    @database_sync_to_async
    def _stored_after(self, seq: int) -> list[dict[str, Any]]:
        return list(Event.objects.filter(job_id=self.job_id, seq__gt=seq).order_by("seq")
                    .values_list("data", flat=True))

    @database_sync_to_async
    def _snapshot(self) -> dict[str, Any]:
        job = Job.objects.get(pk=self.job_id)
        last = Event.objects.filter(job=job).order_by("-seq").values_list("seq", flat=True).first()
        return {
            "type": "snapshot",
            "seq": last or 0,
            "job": {"id": job.pk, "name": job.name, "state": job.state, "step": job.step,
                    "total_steps": job.total_steps, "error": job.error},
            "series": job_series(job.pk),
        }
