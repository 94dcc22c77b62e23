"""Password attempts are throttled per client address and per username, on the token exchange
and on the login form; X-Forwarded-For is believed only from RINGSIDE_TRUSTED_PROXIES, in
Django and in the web server as `serve` runs it."""

import http.client
import ipaddress
import json
import random

import pytest
from django.core.cache import cache
from django.test import Client, RequestFactory
from rest_framework.settings import api_settings
from rest_framework.test import APIClient

from jobs.login import client_address

pytestmark = pytest.mark.django_db

PROXY = "10.0.0.2"
RIGHT = {"username": "ada", "password": "pw-ada-123"}


@pytest.fixture(autouse=True)
def fresh_throttles():
    """Throttle counters live in the cache the web server shares: each test starts from none."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def rates(settings):
    """Set the two login rates: rates(address, account), attempts per minute."""
    def set_rates(address: int, account: int) -> None:
        settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
            "login": f"{address}/minute", "login_account": f"{account}/minute"}}
    return set_rates


@pytest.fixture
def trusted_proxy(settings):
    settings.TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.0/30"),)


def exchange(password: str, username: str = "ada", peer: str = "127.0.0.1",
             forwarded: str | None = None) -> int:
    headers = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded else {}
    return APIClient(REMOTE_ADDR=peer, **headers).post(
        "/api/auth/token/", {"username": username, "password": password},
        format="json").status_code


def test_the_client_address_believes_forwarded_for_only_from_a_trusted_proxy(trusted_proxy):
    def address(peer: str, forwarded: str) -> str:
        return client_address(RequestFactory().get(
            "/", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded))

    assert address("198.51.100.9", "203.0.113.5") == "198.51.100.9"
    assert address(PROXY, "203.0.113.5") == "203.0.113.5"
    # a client's own made-up entries sit left of what the trusted proxies appended
    assert address(PROXY, "1.2.3.4, 203.0.113.5, 10.0.0.1") == "203.0.113.5"
    assert address(PROXY, "10.0.0.1") == "10.0.0.1"  # proxies all the way: the leftmost
    assert address(PROXY, "not-an-address") == "not-an-address"
    assert address(PROXY, "") == PROXY


def test_guesses_from_one_address_are_429_and_a_new_forwarded_for_does_not_reset_it(
        user, rates):
    rates(address=3, account=100)
    guesses = [exchange(f"g{i}", forwarded=f"198.51.100.{i}") for i in range(4)]
    assert guesses == [400, 400, 400, 429]
    refused = APIClient().post("/api/auth/token/", RIGHT, format="json")
    # even the right password waits: the limit is on attempts, not on failures
    assert refused.status_code == 429 and 0 < int(refused["Retry-After"]) <= 60
    assert set(refused.json()) == {"detail"}  # the API's error shape
    assert exchange("pw-ada-123", peer="10.9.9.9") == 200  # another address is not limited


def test_guesses_at_one_account_from_many_addresses_are_429(user, rates, trusted_proxy):
    """A proxy we trust forwards guesses from a new client address each time: the address
    counts never fill, the account's does."""
    rates(address=100, account=3)
    guesses = [exchange(f"g{i}", peer=PROXY, forwarded=f"203.0.113.{i}") for i in range(4)]
    assert guesses == [400, 400, 400, 429]
    assert exchange("pw-ada-123", peer="198.51.100.1") == 429
    assert exchange("anything", username="grace") == 400  # another account is not limited


def test_a_trusted_proxys_forwarded_address_is_the_one_counted(user, rates, trusted_proxy):
    rates(address=2, account=100)
    assert [exchange(f"g{i}", peer=PROXY, forwarded="203.0.113.7") for i in range(3)] == [
        400, 400, 429]
    assert exchange("pw-ada-123", peer="203.0.113.7") == 429  # the same client, direct
    assert exchange("pw-ada-123", peer=PROXY, forwarded="203.0.113.8") == 200
    assert exchange("pw-ada-123", peer="10.0.0.1") == 200  # the proxy itself is no client


def test_the_login_form_is_throttled_and_says_so(user, rates):
    rates(address=2, account=100)
    browser = Client()
    for page in ("/login/", "/"):  # both show the form; their attempts count together
        assert browser.post(page, {"username": "ada", "password": "wrong"}).status_code == 200
    refused = browser.post("/login/", RIGHT)
    assert refused.status_code == 429 and 0 < int(refused["Retry-After"]) <= 60
    page = refused.content.decode()
    assert "Too many login attempts; try again in" in page
    # the password was not checked: no "wrong password" either way, and no session
    assert "Wrong username or password" not in page
    assert "_auth_user_id" not in browser.session
    assert browser.post("/", RIGHT).status_code == 429


def test_the_login_form_counts_per_account_across_addresses(user, rates, trusted_proxy):
    rates(address=100, account=2)
    statuses = [Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=f"203.0.113.{i}").post(
        "/login/", {"username": "ada", "password": f"g{i}"}).status_code for i in range(3)]
    assert statuses == [200, 200, 429]
    right = Client(REMOTE_ADDR="198.51.100.3").post("/login/", RIGHT)
    assert right.status_code == 429


def guesses_over_the_live_server(port: int, count: int, source: str,
                                 forwarded: bool) -> list[int]:
    """`count` wrong passwords, each for another username and over a new connection from
    `source`; with `forwarded`, each with a new X-Forwarded-For."""
    statuses = []
    for i in range(count):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30,
                                                source_address=(source, 0))
        headers = {"Content-Type": "application/json"}
        if forwarded:
            headers["X-Forwarded-For"] = f"198.51.100.{i % 250}"
        connection.request("POST", "/api/auth/token/", json.dumps(
            {"username": f"nobody-{i}", "password": "wrong"}), headers=headers)
        statuses.append(connection.getresponse().status)
        connection.close()
    return statuses


def test_the_login_throttle_holds_across_the_web_processes(live_server_url):
    """The real server as `serve` runs it (WEB_PROCESSES worker processes; each new connection
    goes to whichever accepts it first): the rate holds for the host, not for each process."""
    rate = int(api_settings.DEFAULT_THROTTLE_RATES["login"].split("/")[0])
    port = int(live_server_url.rsplit(":", 1)[1])
    # an address of loopback's own 127/8, so no other test's guesses count against this one
    address = "127." + ".".join(str(random.randrange(2, 255)) for _ in range(3))
    assert guesses_over_the_live_server(port, rate + 1, address, forwarded=False) == \
        [400] * rate + [429]


def test_the_web_server_believes_no_forwarded_for_from_a_local_connection(live_server_url):
    """uvicorn's own default believes X-Forwarded-For from 127.0.0.1, which every account of
    the machine can connect from: a new header per guess would escape the throttle."""
    rate = int(api_settings.DEFAULT_THROTTLE_RATES["login"].split("/")[0])
    port = int(live_server_url.rsplit(":", 1)[1])
    assert guesses_over_the_live_server(port, rate + 1, "127.0.0.1", forwarded=True) == \
        [400] * rate + [429]
