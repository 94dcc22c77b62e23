"""Websockets refuse what they should: a page of another site (even with the user's session
cookie), and a channel layer that fails ends a socket with a logged line, not a traceback."""

import json
import logging

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from jobs.models import ApiToken
from ringside.asgi import application
from tests.platform.sockets import refusal

pytestmark = pytest.mark.django_db(transaction=True)


def test_only_the_sites_own_pages_and_clients_without_origin_may_open_a_socket(
        live_server_url, user, job):
    browser = Client()
    browser.force_login(user)
    cookie = {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"}
    url = f"ws{live_server_url.removeprefix('http')}/ws/jobs/{job.pk}/"
    # another site, and a page another local account serves on another port of this host
    for origin in ("http://evil.example", "http://localhost:1", "http://127.0.0.1:1"):
        with pytest.raises(InvalidStatus) as refused:
            connect(url, origin=origin, additional_headers=cookie, open_timeout=30)
        assert refused.value.response.status_code == 403
    with connect(url, origin=live_server_url, additional_headers=cookie, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "snapshot"
    token = ApiToken.objects.create(user=user, name="cli")
    with connect(f"{url}?token={token.key}", open_timeout=30) as ws:  # the CLI sends no Origin
        assert json.loads(ws.recv(timeout=30))["type"] == "snapshot"


def failing(*args, **kwargs):
    raise TimeoutError("Redis did not answer in time")


@pytest.mark.parametrize("path", ["/ws/jobs/{job}/", "/ws/jobs/"])
async def test_a_channel_layer_timeout_on_connect_closes_the_socket_with_one_logged_line(
        job, user, path, monkeypatch, caplog):
    monkeypatch.setattr(get_channel_layer(), "group_add", failing)
    token = await database_sync_to_async(ApiToken.objects.create)(user=user, name="ws")
    comm = WebsocketCommunicator(application, path.format(job=job.pk) + f"?token={token.key}")
    with caplog.at_level(logging.WARNING, logger="common.sockets"):
        connected, code = await refusal(comm)
    assert (connected, code) == (False, 1011)
    assert [r.getMessage() for r in caplog.records] == [
        f"websocket {path.format(job=job.pk)} closed: channel layer failed "
        "(TimeoutError: Redis did not answer in time)"]


async def test_a_channel_layer_timeout_on_disconnect_is_logged_not_raised(
        job, user, monkeypatch, caplog):
    token = await database_sync_to_async(ApiToken.objects.create)(user=user, name="ws")
    comm = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/?token={token.key}")
    connected, _ = await comm.connect()
    assert connected and (await comm.receive_json_from(timeout=5))["type"] == "snapshot"
    monkeypatch.setattr(get_channel_layer(), "group_discard", failing)
    with caplog.at_level(logging.WARNING, logger="common.sockets"):
        await comm.disconnect()
        await comm.wait(timeout=5)  # the consumer ended without raising
    assert "channel layer failed" in caplog.text
