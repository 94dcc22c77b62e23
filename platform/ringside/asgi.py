"""The ASGI application: Django over HTTP (static files included, so `manage.py serve` needs
no separate web server) and the websocket routes, authenticated by session or API token."""

import gc
import os
from urllib.parse import urlparse

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ringside.settings")
django_http = get_asgi_application()  # sets Django up before the consumers import models

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import OriginValidator, WebsocketDenier  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from hosts import routing as hosts_routing  # noqa: E402
from monitor import routing as monitor_routing  # noqa: E402
from monitor.consumers import SessionOrTokenAuth  # noqa: E402


class SameOriginValidator(OriginValidator):
    """Refuses a websocket opened by a page of another site. A browser sends the session
    cookie with any websocket, whatever page opens it (websockets have no CORS), so without
    this any site its user visits could watch their jobs. Allowed: the page's own origin (the
    Origin's host and port are the Host the socket was opened on) and the origins named in
    CSRF_TRUSTED_ORIGINS; and no Origin at all, which only clients that are not browsers send
    (the CLI's `websockets` sends none). Not the ALLOWED_HOSTS: a name there matches on any
    port, so a page another local account serves on localhost:<its port> would pass."""

    def __init__(self, application) -> None:
        super().__init__(application, settings.CSRF_TRUSTED_ORIGINS)

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        origin, host = headers.get(b"origin"), headers.get(b"host", b"")
        if origin is None or self._same_or_allowed(origin.decode("latin1"),
                                                   host.decode("latin1")):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    def _same_or_allowed(self, origin: str, host: str) -> bool:
        parsed = urlparse(origin)
        return parsed.netloc.lower() == host.lower() or self.validate_origin(parsed)


application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_http),
        "websocket": SameOriginValidator(
            SessionOrTokenAuth(URLRouter(monitor_routing.websocket_urlpatterns
                                         + hosts_routing.websocket_urlpatterns))
        ),
    }
)

# What is loaded by now (Django, the apps, the engine's modules and torch with them) lives as
# long as the process: keep it out of the garbage collector's full passes, which otherwise walk
# its ~280,000 objects every so often (~140 ms each, the tail of the API's latency).
gc.collect()
gc.freeze()
