"""Named API tokens (through the API and through the token page) and signed webhooks, delivered
to a real HTTP receiver (tests/platform/jobs/receiver.py); how webhooks stay outside the
server's network is tests/platform/jobs/test_webhooks.py."""

import re

import pytest
from django.test import Client
from rest_framework.test import APIClient

from engine.contract import parse_event
from engine.ports import free_port
from jobs.models import ApiToken, AuditEntry, Job, Webhook, token_digest
from jobs.tasks import Supervisor
from tests.platform.jobs.receiver import subscribe

pytestmark = pytest.mark.django_db


def authenticates(key: str) -> bool:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client.get("/api/jobs/").status_code == 200


# -- tokens through the API -----------------------------------------------------------------

def test_a_new_token_shows_its_key_once_and_authenticates(api):
    created = api.post("/api/tokens/", {"name": "ci runner"}, format="json")
    assert created.status_code == 201
    body = created.json()
    assert body["name"] == "ci runner" and re.fullmatch(r"[0-9a-f]{40}", body["key"])
    assert authenticates(body["key"])
    listed = api.get("/api/tokens/").json()["results"]
    assert {t["name"] for t in listed} == {"ci runner", "test"}
    assert all("key" not in t for t in listed)
    # the database holds the key's digest and nothing from which the key can be read back
    stored = ApiToken.objects.filter(name="ci runner").values().get()
    assert stored["digest"] == token_digest(body["key"])
    assert not any(body["key"] in str(value) for value in stored.values())


@pytest.mark.parametrize("name", ["", "x" * 65])
def test_a_token_needs_a_name_of_1_to_64_characters(api, name):
    response = api.post("/api/tokens/", {"name": name}, format="json")
    assert response.status_code == 400 and "name" in response.json()


def test_token_creation_is_limited_per_hour_through_the_api(api, user, settings):
    settings.API_TOKENS_PER_HOUR = 3  # the `api` fixture's own token is the first
    assert [api.post("/api/tokens/", {"name": f"t{i}"}, format="json").status_code
            for i in range(3)] == [201, 201, 429]
    refused = api.post("/api/tokens/", {"name": "t3"}, format="json")
    assert "too many new tokens this hour" in refused.json()["detail"]
    assert 0 < int(refused["Retry-After"]) <= 3600
    assert ApiToken.objects.filter(user=user).count() == 3


# -- tokens through the page ----------------------------------------------------------------

def csrf_token(page) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())[1]


@pytest.fixture
def browser(user) -> Client:
    """A person logged in, whose posts need the page's CSRF token as a browser's do."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def test_the_token_page_creates_a_token_shows_its_key_once_and_revokes_it(browser, user):
    empty = browser.get("/tokens/")
    assert empty.status_code == 200 and b"No tokens yet." in empty.content
    created = browser.post("/tokens/", {"name": "laptop", "csrfmiddlewaretoken":
                                        csrf_token(empty)}, follow=True)
    assert created.redirect_chain == [("/tokens/", 302)]  # a reload does not post again
    key = re.search(r'<code id="new-token">([0-9a-f]{40})</code>', created.content.decode())[1]
    assert authenticates(key)
    again = browser.get("/tokens/")
    assert b"laptop" in again.content and key.encode() not in again.content
    assert b"active" in again.content

    token = ApiToken.objects.get(digest=token_digest(key))
    revoked = browser.post("/tokens/", {"revoke": token.pk,
                                        "csrfmiddlewaretoken": csrf_token(again)}, follow=True)
    assert "Token “laptop” revoked." in revoked.content.decode()
    assert b"revoked " in revoked.content and not authenticates(key)
    assert list(AuditEntry.objects.filter(user=user).values_list("action", "cause")) == [
        ("token.revoke", "user"), ("token.create", "user")]


def test_the_token_page_refuses_a_form_without_its_csrf_token(browser, user):
    assert browser.post("/tokens/", {"name": "forged"}).status_code == 403
    assert not ApiToken.objects.filter(user=user).exists()


def test_the_token_page_revokes_only_the_users_own_tokens(browser, other_user):
    theirs = ApiToken.objects.create(user=other_user, name="theirs")
    page = browser.get("/tokens/")
    response = browser.post("/tokens/", {"revoke": theirs.pk,
                                         "csrfmiddlewaretoken": csrf_token(page)})
    assert response.status_code == 404 and authenticates(theirs.key)


def test_the_token_page_names_a_bad_name_and_the_hourly_limit(browser, user, settings):
    settings.API_TOKENS_PER_HOUR = 1
    page = browser.get("/tokens/")
    nameless = browser.post("/tokens/", {"name": " ", "csrfmiddlewaretoken": csrf_token(page)})
    assert nameless.status_code == 400 and b"name: give the token a name" in nameless.content
    first = browser.post("/tokens/", {"name": "one", "csrfmiddlewaretoken": csrf_token(page)})
    assert first.status_code == 302  # created: back to the page, which shows its key once
    second = browser.post("/tokens/", {"name": "two", "csrfmiddlewaretoken": csrf_token(page)})
    assert second.status_code == 400
    assert b"too many new tokens this hour" in second.content
    assert list(ApiToken.objects.filter(user=user).values_list("name", flat=True)) == ["one"]


# -- webhooks -------------------------------------------------------------------------------

def engine_anomaly(job: Job) -> None:
    """The supervisor handling the engine's anomaly event, as it does for a running job."""
    Supervisor(job, proc=None, ingest=None, me="test").on_event(parse_event({
        "type": "anomaly", "job": str(job.pk), "step": 7, "time": 1.0, "seq": 12,
        "kind": "loss_spike", "severity": "warning", "rank": None,
        "evidence": {"loss": 9.5, "threshold": 6.0}}))


def test_each_webhook_of_a_job_gets_a_payload_signed_with_its_own_secret(
        api, running, receiver, other_user, celery_eager):
    for_job = subscribe(api, receiver, "/job", job=running.pk)
    for_all = subscribe(api, receiver, "/all")
    assert for_job["secret"] != for_all["secret"]
    assert all("secret" not in h for h in api.get("/api/webhooks/").json()["results"])
    bystander = Webhook.objects.create(owner=other_user, url=receiver.url + "/bystander")

    engine_anomaly(running)
    assert sorted(d["path"] for d in receiver.deliveries) == ["/all", "/job"]
    for delivery in receiver.deliveries:
        assert delivery["verified"], delivery["path"]
        assert delivery["event"] == "anomaly"
        body = delivery["body"]
        assert body["event"] == "anomaly"
        assert body["job"] == {"id": running.pk, "name": running.name, "state": "running",
                               "step": 0, "owner": "ada"}
        assert body["data"]["kind"] == "loss_spike" and body["data"]["step"] == 7
    for hook in Webhook.objects.filter(pk__in=[for_job["id"], for_all["id"]]):
        assert hook.last_status == "delivered"
    bystander.refresh_from_db()
    assert bystander.last_status == ""
    assert AuditEntry.objects.get(action="webhook.create", job=running).actor == "ada"


def test_a_receiver_checking_the_signature_rejects_another_secret(api, running, receiver,
                                                                      celery_eager):
    subscribe(api, receiver, "/job", job=running.pk)
    receiver.secrets["/job"] = "not-the-secret"
    engine_anomaly(running)
    assert [d["verified"] for d in receiver.deliveries] == [False]


def test_a_dead_receiver_is_unreachable_and_does_not_stop_the_supervisor(
        api, running, loopback_allowed, celery_eager, settings):
    settings.WEBHOOK_ATTEMPTS = 2
    created = api.post("/api/webhooks/", {"url": f"http://127.0.0.1:{free_port()}/gone",
                                          "job": running.pk}, format="json").json()
    engine_anomaly(running)
    assert Webhook.objects.get(pk=created["id"]).last_status == "unreachable"


def test_a_webhook_on_another_users_job_is_refused_naming_the_field(api, other_user,
                                                                    small_spec,
                                                                    loopback_allowed):
    theirs = Job.objects.create(name="theirs", owner=other_user, spec=small_spec)
    response = api.post("/api/webhooks/", {"url": "http://127.0.0.1:9/x", "job": theirs.pk},
                        format="json")
    assert response.status_code == 400 and "job" in response.json()
    assert not Webhook.objects.exists()
