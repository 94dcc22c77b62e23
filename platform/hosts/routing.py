from django.urls import path

from hosts.consumers import HostsConsumer

websocket_urlpatterns = [
    path("ws/hosts/", HostsConsumer.as_asgi()),
]
