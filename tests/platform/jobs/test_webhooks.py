"""Webhooks that cannot reach inside (jobs.webhooks, the Webhook API): internal addresses are
refused at creation and again at each delivery, which connects to the address it checked,
follows no redirect and says how it went without the network's own words; deliveries are
Celery tasks, retried with backoff; a user holds a bounded number of webhooks."""

import json
from ipaddress import ip_network

import pytest
from celery import signals

from engine.ports import free_port
from jobs.models import Job, Webhook
from jobs.webhooks import deliver, notify
from tests.platform.jobs.receiver import Receiver, subscribe

pytestmark = pytest.mark.django_db

INTERNAL = ["http://127.0.0.1:8000/hook", "http://127.1/", "http://2130706433/",
            "http://0x7f000001/", "http://0177.0.0.1/", "http://0.0.0.0/", "http://[::1]/",
            "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/", "http://localhost/",
            "http://localhost./", "http://LOCALHOST:8000/", "http://169.254.169.254/",
            "http://10.0.0.1/", "http://172.16.0.1/", "http://192.168.0.1/",
            "http://100.64.0.1/", "http://224.0.0.1/", "http://255.255.255.255/",
            "http://[fc00::1]/", "http://[fe80::1]/", "http://[::]/",
            "http://evil@127.0.0.1/", "file:///etc/passwd", "gopher://127.0.0.1:6379/_x",
            "ftp://127.0.0.1/"]


def body_of(event: str = "anomaly") -> str:
    return json.dumps({"event": event, "data": {}})


def hook_at(user, url: str) -> Webhook:
    """A webhook as the API stored it when the operator allowed its address."""
    return Webhook.objects.create(owner=user, url=url)


@pytest.fixture
def retries():
    """The countdown of each retry Celery was asked for (Celery's `task_retry` signal)."""
    waits: list[float] = []

    def record(sender=None, reason=None, **kwargs):
        waits.append(reason.when)

    signals.task_retry.connect(record, weak=False)
    yield waits
    signals.task_retry.disconnect(record)


# -- at creation ----------------------------------------------------------------------------

@pytest.mark.parametrize("url", INTERNAL)
def test_an_internal_address_is_refused_at_creation_naming_the_url(api, url):
    response = api.post("/api/webhooks/", {"url": url}, format="json")
    assert response.status_code == 400, response.json()
    assert list(response.json()) == ["url"]
    assert not Webhook.objects.exists()


def test_a_refusal_says_not_a_public_address_and_nothing_of_what_answers(api):
    for url in ["http://127.0.0.1:8000/", "http://[::ffff:127.0.0.1]/", "http://10.0.0.1/"]:
        response = api.post("/api/webhooks/", {"url": url}, format="json")
        assert response.json() == {"url": ["not a public address"]}, url


def test_the_allow_list_lets_a_loopback_receiver_in(api, loopback_allowed):
    response = api.post("/api/webhooks/", {"url": "http://127.0.0.1:8000/hook"}, format="json")
    assert response.status_code == 201
    refused = api.post("/api/webhooks/", {"url": "http://10.0.0.1/"}, format="json")
    assert refused.json() == {"url": ["not a public address"]}


def test_a_user_holds_at_most_the_configured_number_of_webhooks(api, user, other_user,
                                                                loopback_allowed, settings):
    settings.RINGSIDE_WEBHOOKS_PER_USER = 2
    hook_at(other_user, "http://127.0.0.1:1/theirs")  # another user's do not count
    codes = [api.post("/api/webhooks/", {"url": f"http://127.0.0.1:{9000 + i}/"},
                      format="json").status_code for i in range(3)]
    assert codes == [201, 201, 429]
    refused = api.post("/api/webhooks/", {"url": "http://127.0.0.1:9/"}, format="json")
    assert refused.json() == {"detail": "at most 2 webhooks per user: delete one to add another"}
    assert Webhook.objects.filter(owner=user).count() == 2
    api.delete(f"/api/webhooks/{Webhook.objects.filter(owner=user).first().pk}/")
    assert api.post("/api/webhooks/", {"url": "http://127.0.0.1:9/"},
                    format="json").status_code == 201


# -- at delivery ----------------------------------------------------------------------------

def test_an_address_allowed_at_creation_and_not_at_delivery_gets_no_request(
        api, receiver, settings, user):
    """The replay of a hook whose address turned internal after its creation (the operator
    dropped it from the allow-list; a DNS name rebound to loopback is refused the same way,
    its address being checked at each delivery)."""
    hook = subscribe(api, receiver, "/inside")
    settings.RINGSIDE_WEBHOOK_ALLOW = ()
    assert deliver.apply((hook["id"], "anomaly", body_of())).get() == (
        "refused: not a public address")
    assert receiver.requests == []
    assert Webhook.objects.get(pk=hook["id"]).last_status == "refused: not a public address"


def test_a_delivery_is_signed_and_recorded_as_delivered(api, receiver):
    hook = subscribe(api, receiver, "/ok")
    assert deliver.apply((hook["id"], "job.completed", body_of("job.completed"))).get() == (
        "delivered")
    (delivery,) = receiver.deliveries
    assert delivery["verified"] and delivery["event"] == "job.completed"
    assert Webhook.objects.get(pk=hook["id"]).last_status == "delivered"


def test_the_urls_name_travels_in_the_host_header_to_an_address_checked(
        user, receiver, settings):
    """`localhost` resolves to loopback (and ::1 on some hosts, where nothing listens here):
    the request goes to a checked address and still names the host the URL names."""
    settings.RINGSIDE_WEBHOOK_ALLOW = (*settings.RINGSIDE_WEBHOOK_ALLOW,
                                       ip_network("::1/128"))
    port = receiver.server.server_port
    hook = hook_at(user, f"http://localhost:{port}/named")
    assert deliver.apply((hook.pk, "anomaly", body_of())).get() == "delivered"
    assert receiver.requests == [("POST", "/named", f"localhost:{port}")]


def test_a_receiver_answering_500_is_retried_with_backoff_then_recorded(
        user, receiver, settings, retries):
    settings.WEBHOOK_ATTEMPTS, settings.WEBHOOK_RETRY_S = 3, 2.0
    receiver.answers["/broken"] = 500
    hook = hook_at(user, receiver.url + "/broken")
    assert deliver.apply((hook.pk, "anomaly", body_of())).get() == (
        "refused by the receiver (HTTP 500)")
    assert [r[1] for r in receiver.requests] == ["/broken"] * 3
    assert retries == [2.0, 4.0]
    hook.refresh_from_db()
    assert hook.last_status == "refused by the receiver (HTTP 500)"


def test_a_receiver_refusing_with_4xx_is_not_retried(user, receiver, retries):
    receiver.answers["/wrong"] = 404
    hook = hook_at(user, receiver.url + "/wrong")
    assert deliver.apply((hook.pk, "anomaly", body_of())).get() == (
        "refused by the receiver (HTTP 404)")
    assert len(receiver.requests) == 1 and retries == []


@pytest.mark.parametrize("location", ["/landing", "http://127.0.0.1:{port}/landing",
                                      "http://169.254.169.254/latest/meta-data/"])
def test_a_redirect_is_not_followed(user, receiver, location, retries):
    receiver.answers["/moved"] = (302, location.format(port=receiver.server.server_port))
    hook = hook_at(user, receiver.url + "/moved")
    assert deliver.apply((hook.pk, "anomaly", body_of())).get() == (
        "refused by the receiver (HTTP 302)")
    assert receiver.requests == [("POST", "/moved", receiver.url.removeprefix("http://"))]
    assert retries == []


def test_an_unreachable_receiver_is_retried_and_says_only_unreachable(
        user, loopback_allowed, settings, retries):
    settings.WEBHOOK_ATTEMPTS, settings.WEBHOOK_TIMEOUT_S = 2, 0.5
    hook = hook_at(user, f"http://127.0.0.1:{free_port()}/gone")
    assert deliver.apply((hook.pk, "anomaly", body_of())).get() == "unreachable"
    assert len(retries) == 1
    hook.refresh_from_db()
    assert hook.last_status == "unreachable"  # not "Connection refused": no port scanner


def test_a_hook_deleted_before_its_delivery_is_skipped(user):
    hook = hook_at(user, "http://127.0.0.1:9/")
    hook_id = hook.pk
    hook.delete()
    assert deliver.apply((hook_id, "anomaly", body_of())).get() == "gone"


def test_notify_queues_the_deliveries_and_sends_nothing_itself(user, running,
                                                               loopback_allowed):
    """Without a worker taking the queue, notify returns at once: the supervisor calling it
    never waits on a receiver."""
    listener = Receiver()
    try:
        hook = hook_at(user, listener.url + "/later")
        assert notify(running, "anomaly", {"kind": "loss_spike"}) == 1
        assert listener.requests == []
        hook.refresh_from_db()
        assert hook.last_status == ""
    finally:
        listener.close()


def test_notify_without_webhooks_queues_nothing(user, small_spec):
    assert notify(Job.objects.create(name="quiet", owner=user, spec=small_spec), "x") == 0


def test_notify_with_the_broker_down_queues_nothing_and_returns(user, running, broker_down,
                                                                loopback_allowed):
    for port in (1, 2, 3):
        hook_at(user, f"http://127.0.0.1:{port}/")
    assert notify(running, "anomaly") == 0
