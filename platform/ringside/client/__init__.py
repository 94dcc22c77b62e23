"""The Ringside client: `Client(url, token)` for scripts, and the `ringside` command
(`ringside.client.cli`). It talks to a server over HTTP and websockets only and imports no
Django, so it runs anywhere the package is installed."""

from ringside.client.api import ApiError, Client

__all__ = ["ApiError", "Client"]
