"""Live updates of the Hosts page: a change to a host (a beat, a drain, a placement that takes
or frees its slots) is announced to the "hosts" channel-layer group by name; each socket
(hosts.consumers.HostsConsumer) reads the host's record from the database and sends it."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

HOSTS_GROUP = "hosts"


def publish(*names: str) -> None:
    """Tell the Hosts pages that these hosts changed. Never raises: the change is stored, and
    a page that missed it is corrected by the host's next beat or its next snapshot."""
    layer = get_channel_layer()

    async def send() -> None:
        for name in names:
            await layer.group_send(HOSTS_GROUP, {"type": "host.changed", "name": name})

    try:
        async_to_sync(send)()
    except Exception:
        log.warning("could not announce hosts %s to the Hosts pages", ", ".join(names),
                    exc_info=True)
