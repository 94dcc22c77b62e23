"""What every websocket of the platform shares: the close code for an unauthenticated socket,
and how a channel-layer failure ends one."""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import Any

from redis.exceptions import RedisError

CLOSE_UNAUTHENTICATED = 4401
CLOSE_LAYER_FAILED = 1011  # the server cannot go on: its channel layer (Redis) failed
# what a slow or unreachable Redis raises from the channel layer (asyncio's timeouts are the
# builtin TimeoutError; lost connections are OSErrors)
LAYER_ERRORS = (TimeoutError, OSError, RedisError)

log = logging.getLogger(__name__)


class LayerErrors:
    """A channel-layer failure (group_add on connect, group_discard on disconnect, receiving
    group messages) ends the socket with one logged line and close code 1011, instead of an
    ASGI traceback per socket; the client reconnects with `?after=` once Redis is back."""

    async def join(self, group: str) -> bool:
        """Join a group; False (the socket closed, the failure logged) if the layer failed."""
        try:
            await self.channel_layer.group_add(group, self.channel_name)
        except LAYER_ERRORS as e:
            _log_layer_failure(self.scope, e)
            await self.close(code=CLOSE_LAYER_FAILED)
            return False
        return True

    async def leave(self, group: str) -> None:
        try:
            await self.channel_layer.group_discard(group, self.channel_name)
        except LAYER_ERRORS as e:  # the socket is closing anyway
            _log_layer_failure(self.scope, e)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except LAYER_ERRORS as e:  # receiving group messages failed
            _log_layer_failure(scope, e)
            with suppress(Exception):  # the client may be gone already; nothing to tell it
                await send({"type": "websocket.close", "code": CLOSE_LAYER_FAILED})


def _log_layer_failure(scope: dict[str, Any], error: BaseException) -> None:
    log.warning("websocket %s closed: channel layer failed (%s: %s)", scope.get("path"),
                type(error).__name__, error)
