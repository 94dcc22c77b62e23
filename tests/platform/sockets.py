"""Websocket tests end every consumer as a server does: once a consumer has closed the socket
(a refused handshake, an error answered), the server sends `websocket.disconnect` and the
consumer stops. A consumer left running keeps a channel-layer receive pending past the test,
and cancelling that receive while the test's event loop closes can wait forever."""

from __future__ import annotations

from channels.testing import WebsocketCommunicator


async def refusal(comm: WebsocketCommunicator) -> tuple[bool, int | None]:
    """(accepted, close code) of a handshake, the consumer then ended."""
    answer = await comm.connect()
    await comm.disconnect()
    return answer
