"""Who may see and steer what, over every endpoint the OpenAPI schema documents: another
user's job is 404 everywhere and stays untouched, anonymous clients get 401, staff see and
steer every job, a revoked token stops working at once (API and websockets), session-cookie
websockets are owner-checked, API POSTs on a session need the CSRF token, and the audit log
names who did what (the login throttles: test_login.py)."""

import functools

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.core.cache import cache
from django.test import Client
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from jobs.models import (
    ApiToken,
    AuditEntry,
    Checkpoint,
    Command,
    Export,
    Job,
    JobEvent,
    State,
    Webhook,
)
from monitor.ingest import store_events
from ringside.asgi import application
from tests.platform.sockets import refusal

pytestmark = pytest.mark.django_db


@functools.cache
def operations() -> list[tuple[str, str, dict]]:
    """(method, path, operation) of every operation in the OpenAPI schema."""
    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    return [(method, path, operation) for path, methods in paths.items()
            for method, operation in methods.items()]


def job_operations() -> list[tuple[str, str]]:
    """Every operation on one job: its reads, its commands, its telemetry."""
    return [(method, path) for method, path, _ in operations()
            if path.startswith("/api/jobs/{")]


def required_query(method: str, path: str) -> dict[str, str]:
    """The operation's required query parameters, each at the first of its allowed values."""
    operation = next(op for m, p, op in operations() if (m, p) == (method, path))
    return {p["name"]: p["schema"]["enum"][0] for p in operation.get("parameters", [])
            if p["in"] == "query" and p.get("required")}


def request(client: APIClient, method: str, path: str, job_id: int = 1):
    checkpoint = Checkpoint.objects.filter(job_id=job_id).values_list("pk", flat=True).first()
    url = path.replace("{id}", str(job_id)).replace("{job_id}", str(job_id)).replace(
        "{checkpoint_id}", str(checkpoint or 1)).replace("{proposal_id}", "p-1-1")
    return getattr(client, method)(url, {}, format="json") if method == "post" else \
        getattr(client, method)(url, required_query(method, path))


def client_with_token(token: ApiToken) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def theirs(other_user, small_spec) -> Job:
    """Another user's running job, with some of everything stored."""
    job = Job.objects.create(name="theirs", owner=other_user, spec=small_spec)
    job.start(supervisor="test")
    job.mark_running()
    store_events(job.pk, [
        {"type": "step", "job": str(job.pk), "step": 1, "time": 1.0, "seq": 1, "loss": 5.0},
        {"type": "ops", "job": str(job.pk), "step": 1, "time": 1.0, "seq": 2, "step_ms": 9.0,
         "void_share": 0.0, "data_wait_share": 0.0, "ranks": [],
         "ops": {"forward": {"kind": "compute", "count": 1, "total_ms": 8.0, "mean_ms": 8.0,
                             "max_ms": 8.0, "slowest_rank": 0, "per_rank_ms": [8.0]}}},
        {"type": "experts", "job": str(job.pk), "step": 1, "time": 1.0, "seq": 3,
         "layers": [{"tokens_per_expert": [3, 1], "max_violation": 0.5, "dead_experts": 0}]},
        {"type": "checkpoint", "job": str(job.pk), "step": 1, "time": 1.0, "seq": 4,
         "path": "/runs/theirs/step-000001", "tier": "disk", "blocking_s": 0.1,
         "size_bytes": 10, "strategy": "NNN", "world_size": 1},
    ])
    Export.objects.create(checkpoint=Checkpoint.objects.get(job=job), out_dir="/exports/theirs",
                          state="done")
    return job


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("root", password="pw-root-123", is_staff=True)


@pytest.fixture(autouse=True)
def fresh_throttles():
    """Throttle counters live in the process's cache: each test starts from none."""
    cache.clear()
    yield
    cache.clear()


def test_the_job_endpoints_checked_here_include_every_one_the_issue_names():
    commands = {("post", f"/api/jobs/{{id}}/{kind}/") for kind in (
        "pause", "resume", "cancel", "rollback", "reshard", "checkpoint", "clone")}
    reads = {("get", f"/api/jobs/{{id}}/{read}") for read in (
        "", "checkpoints/", "events/", "anomalies/", "commands/", "metrics/")}
    telemetry = {("get", "/api/jobs/{job_id}/ops/"), ("get", "/api/jobs/{job_id}/experts/")}
    assert commands | reads | telemetry <= set(job_operations())


def test_another_users_job_is_404_on_every_endpoint_and_nothing_happens_to_it(api, theirs):
    jobs, events = Job.objects.count(), JobEvent.objects.filter(job=theirs).count()
    for method, path in job_operations():
        response = request(api, method, path, theirs.pk)
        assert response.status_code == 404, (method, path, response.status_code)
    theirs.refresh_from_db()
    assert theirs.state == State.RUNNING and theirs.cancel_requested_at is None
    assert JobEvent.objects.filter(job=theirs).count() == events
    assert Job.objects.count() == jobs  # no clone
    assert not Command.objects.exists() and not AuditEntry.objects.exists()


def test_anonymous_clients_get_401_everywhere_but_the_token_exchange(user):
    open_to_anonymous = set()
    for method, path, operation in operations():
        if {} in operation.get("security", []):
            open_to_anonymous.add((method, path))
            continue
        response = request(APIClient(), method, path)
        assert response.status_code == 401, (method, path, response.status_code)
        assert response["WWW-Authenticate"] == "Token"
    assert open_to_anonymous == {("post", "/api/auth/token/")}


def test_staff_read_and_steer_every_job_and_the_owner_sees_who_did_it(theirs, staff,
                                                                       other_user):
    root = client_with_token(ApiToken.objects.create(user=staff, name="ops"))
    for method, path in job_operations():
        if method == "get":
            response = request(root, method, path, theirs.pk)
            assert response.status_code == 200, (path, response.status_code)
    assert root.post(f"/api/jobs/{theirs.pk}/pause/").status_code == 202
    theirs.refresh_from_db()
    assert theirs.state == State.PAUSING
    event = theirs.transitions.last()
    assert (event.cause, event.actor) == ("api_token", "root")

    owner = client_with_token(ApiToken.objects.create(user=other_user, name="mine"))
    audit = owner.get("/api/audit/").json()["results"]
    assert [(a["action"], a["actor"], a["cause"], a["job"]) for a in audit] == [
        ("job.pause", "root", "api_token", theirs.pk)]


def test_a_token_from_the_token_exchange_authenticates_until_it_is_revoked(user, small_spec):
    mine = Job.objects.create(name="mine", owner=user, spec=small_spec)
    anonymous = APIClient()
    credentials = {"username": "ada", "password": "pw-ada-123"}
    key = anonymous.post("/api/auth/token/", credentials, format="json").json()["token"]
    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert [j["id"] for j in script.get("/api/jobs/").json()["results"]] == [mine.pk]
    default = ApiToken.objects.get(user=user, name="default", revoked__isnull=True)
    assert script.delete(f"/api/tokens/{default.pk}/").status_code == 204
    revoked = script.get("/api/jobs/")
    assert revoked.status_code == 401
    assert revoked.json() == {"detail": "Invalid or revoked token."}
    fresh = anonymous.post("/api/auth/token/", credentials, format="json").json()["token"]
    assert fresh != key
    script.credentials(HTTP_AUTHORIZATION=f"Token {fresh}")
    assert script.get("/api/jobs/").status_code == 200


def test_logging_in_again_issues_a_new_key_and_revokes_the_last_login(user):
    """The server keeps only digests, so it cannot answer with the key it issued before: a
    new `default` token replaces the previous one, which stops working at once; named tokens
    stay."""
    named = client_with_token(ApiToken.objects.create(user=user, name="ci"))
    credentials = {"username": "ada", "password": "pw-ada-123"}
    first, second = (APIClient().post("/api/auth/token/", credentials, format="json")
                     .json()["token"] for _ in range(2))
    assert first != second
    statuses = {}
    for key in (first, second):
        script = APIClient()
        script.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        statuses[key] = script.get("/api/jobs/").status_code
    assert statuses == {first: 401, second: 200}
    assert named.get("/api/jobs/").status_code == 200
    listed = named.get("/api/tokens/").json()["results"]
    assert sorted((t["name"], t["revoked"] is None) for t in listed) == [
        ("ci", True), ("default", False), ("default", True)]


def test_revoking_one_token_leaves_the_others_working(user):
    keep, drop = (ApiToken.objects.create(user=user, name=n) for n in ("keep", "drop"))
    kept = client_with_token(keep)
    assert kept.delete(f"/api/tokens/{drop.pk}/").status_code == 204
    assert client_with_token(drop).get("/api/jobs/").status_code == 401
    listed = {t["name"]: t["revoked"] for t in kept.get("/api/tokens/").json()["results"]}
    assert listed["drop"] is not None and listed["keep"] is None
    assert kept.get("/api/jobs/").status_code == 200


def test_a_deactivated_users_tokens_stop_working(user):
    token = ApiToken.objects.create(user=user, name="laptop")
    user.is_active = False
    user.save()
    assert client_with_token(token).get("/api/jobs/").status_code == 401


def test_another_users_tokens_and_webhooks_are_404_and_stay(api, other_user):
    token = ApiToken.objects.create(user=other_user, name="theirs")
    hook = Webhook.objects.create(owner=other_user, url="http://127.0.0.1:9/hook")
    assert api.delete(f"/api/tokens/{token.pk}/").status_code == 404
    assert api.delete(f"/api/webhooks/{hook.pk}/").status_code == 404
    token.refresh_from_db()
    assert token.revoked is None and Webhook.objects.filter(pk=hook.pk).exists()
    assert api.get("/api/tokens/").json()["results"][0]["name"] == "test"  # only its own
    assert api.get("/api/webhooks/").json()["results"] == []


def test_a_session_needs_the_csrf_token_to_post_and_a_token_does_not(user, small_spec):
    job = Job.objects.create(name="mine", owner=user, spec=small_spec)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.get(f"/api/jobs/{job.pk}/").status_code == 200
    forged = browser.post(f"/api/jobs/{job.pk}/cancel/", {}, content_type="application/json")
    assert forged.status_code == 403 and "CSRF" in forged.json()["detail"]
    job.refresh_from_db()
    assert job.state == State.QUEUED
    script = APIClient(enforce_csrf_checks=True)
    script.credentials(HTTP_AUTHORIZATION="Token " + ApiToken.objects.create(
        user=user, name="script").key)
    assert script.post(f"/api/jobs/{job.pk}/cancel/").status_code == 202


def test_the_audit_log_lists_control_actions_newest_first_with_actor_and_cause(
        api, user, other_user, staff, small_spec, loopback_allowed):
    created = api.post("/api/jobs/", small_spec, format="json").json()
    api.post(f"/api/jobs/{created['id']}/cancel/")
    api.post("/api/tokens/", {"name": "ci"}, format="json")
    browser = APIClient()
    browser.force_authenticate(user)  # a person on the pages: cause "user"
    browser.post("/api/webhooks/", {"url": "http://127.0.0.1:9/hook"}, format="json")
    theirs = Job.objects.create(name="theirs", owner=other_user, spec=small_spec)
    client_with_token(ApiToken.objects.create(user=other_user, name="t")).post(
        f"/api/jobs/{theirs.pk}/cancel/")

    audit = api.get("/api/audit/").json()["results"]
    assert [(a["action"], a["actor"], a["cause"], a["job"]) for a in audit] == [
        ("webhook.create", "ada", "user", None),
        ("token.create", "ada", "api_token", None),
        ("job.cancel", "ada", "api_token", created["id"]),
        ("job.create", "ada", "api_token", created["id"]),
    ]
    assert audit[1]["details"]["name"] == "ci"
    root = APIClient()
    root.force_authenticate(staff)
    assert {a["job"] for a in root.get("/api/audit/").json()["results"]} == {
        None, created["id"], theirs.pk}


# -- websockets: the real ASGI application with its session and token middleware ---------

def websocket(path: str, cookie: str = "") -> WebsocketCommunicator:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, path, headers=headers)


def session_cookie(user) -> str:
    browser = Client()
    browser.force_login(user)
    return f"sessionid={browser.cookies['sessionid'].value}"


@pytest.mark.django_db(transaction=True)
async def test_a_session_cookie_opens_the_owners_job_socket_and_no_one_elses(user, other_user,
                                                                          small_spec):
    mine = await database_sync_to_async(Job.objects.create)(name="mine", owner=user,
                                                            spec=small_spec)
    theirs = await database_sync_to_async(Job.objects.create)(name="theirs", owner=other_user,
                                                              spec=small_spec)
    cookie = await database_sync_to_async(session_cookie)(user)
    owner = websocket(f"/ws/jobs/{mine.pk}/", cookie)
    assert (await owner.connect())[0]
    snapshot = await owner.receive_json_from(timeout=5)
    assert (snapshot["type"], snapshot["job"]["id"]) == ("snapshot", mine.pk)
    await owner.disconnect()
    assert await refusal(websocket(f"/ws/jobs/{theirs.pk}/", cookie)) == (False, 4404)
    listing = websocket("/ws/jobs/", cookie)
    assert (await listing.connect())[0]
    assert [j["id"] for j in (await listing.receive_json_from(timeout=5))["jobs"]] == [mine.pk]
    await listing.disconnect()
    forged = "sessionid=" + "x" * 32
    assert await refusal(websocket(f"/ws/jobs/{mine.pk}/", forged)) == (False, 4401)


@pytest.mark.django_db(transaction=True)
async def test_a_revoked_token_opens_no_socket(user, small_spec):
    job = await database_sync_to_async(Job.objects.create)(name="mine", owner=user,
                                                           spec=small_spec)
    token = await database_sync_to_async(ApiToken.objects.create)(user=user, name="ws")
    live = websocket(f"/ws/jobs/{job.pk}/?token={token.key}")
    assert (await live.connect())[0]
    await live.disconnect()
    await database_sync_to_async(token.revoke)()
    for path in (f"/ws/jobs/{job.pk}/", "/ws/jobs/"):
        assert await refusal(websocket(f"{path}?token={token.key}")) == (False, 4401), path
