"""The ASGI application: Django over HTTP (static files included, so `manage.py serve` needs
no separate web server) and the websocket routes, authenticated by session or API token."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ringside.settings")
django_http = get_asgi_application()  # sets Django up before the consumers import models

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from monitor.consumers import SessionOrTokenAuth  # noqa: E402
from monitor.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_http),
        "websocket": AllowedHostsOriginValidator(
            SessionOrTokenAuth(URLRouter(websocket_urlpatterns))
        ),
    }
)

# What is loaded by now (Django, the apps, the engine's modules and torch with them) lives as
# long as the process: keep it out of the garbage collector's full passes, which otherwise walk
# its ~280,000 objects every so often (~140 ms each, the tail of the API's latency).
gc.collect()
gc.freeze()
