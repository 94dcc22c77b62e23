"""`/ws/hosts/`: the Hosts page's live feed. First a `snapshot` (every host's record, as
`/api/hosts/` lists them, with `now`, the server's clock, and `lost_after_s`), then a `host`
message with the record of each host that changes (its beat, a drain, slots taken or freed:
hosts.live). A host that stops beating sends nothing: the page ages its beat against `now`
and shows it lost after `lost_after_s`. 4401 closes a socket that is not authenticated."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.utils import timezone

from common.sockets import CLOSE_UNAUTHENTICATED, LayerErrors
from hosts import status
from hosts.api import HostSerializer
from hosts.live import HOSTS_GROUP
from hosts.models import Host


class HostsConsumer(LayerErrors, AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if not await self.join(HOSTS_GROUP):
            return
        self.joined = True
        await self.accept()
        await self.send_json(await self._snapshot())

    async def disconnect(self, code: int) -> None:
        if getattr(self, "joined", False):
            await self.leave(HOSTS_GROUP)

    async def receive_json(self, content: Any, **kwargs) -> None:
        await self.send_json({"type": "error", "error": "this socket is read-only"})

    async def host_changed(self, message: dict[str, Any]) -> None:
        record = await self._record(message["name"])
        if record is not None:
            await self.send_json({"type": "host", "now": timezone.now().isoformat(),
                                  "host": record})

    @database_sync_to_async
    def _snapshot(self) -> dict[str, Any]:
        hosts = status.records(status.with_holdings(Host.objects.all()), self.scope["user"])
        return {"type": "snapshot", "now": timezone.now().isoformat(),
                "lost_after_s": settings.HOST_LOST_AFTER_S,
                "hosts": HostSerializer(hosts, many=True).data}

    @database_sync_to_async
    def _record(self, name: str) -> dict[str, Any] | None:
        host = status.with_holdings(Host.objects.filter(name=name)).first()
        if host is None:
            return None
        return HostSerializer(status.record(host, self.scope["user"])).data
