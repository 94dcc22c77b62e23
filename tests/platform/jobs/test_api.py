"""jobs.api: auth, spec validation, ownership, cancel conflicts, metrics, schema; the command
rules the job page enables its controls by, the steering actions as named methods of the job
viewset, and cloning a job from one of its checkpoints."""

import inspect

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from engine.contract import COMMAND_RULES, CommandKind
from jobs.api import JobViewSet
from jobs.bodies import CommandBody
from jobs.models import Checkpoint, Job, State
from monitor.ingest import store_events
from tests.platform.services import stored_checkpoint

pytestmark = pytest.mark.django_db


def test_a_token_is_issued_for_a_username_and_password(user):
    client = APIClient()
    ok = client.post("/api/auth/token/", {"username": "ada", "password": "pw-ada-123"},
                     format="json")
    assert ok.status_code == 200 and len(ok.json()["token"]) == 40
    wrong = client.post("/api/auth/token/", {"username": "ada", "password": "nope"},
                        format="json")
    assert wrong.status_code == 400


@pytest.mark.parametrize("method, path", [
    ("get", "/api/jobs/"), ("post", "/api/jobs/"), ("get", "/api/jobs/1/"),
    ("post", "/api/jobs/1/cancel/"), ("get", "/api/jobs/1/metrics/"),
])
def test_unauthenticated_requests_get_401(method, path):
    response = getattr(APIClient(), method)(path)
    assert response.status_code == 401
    bad_token = APIClient()
    bad_token.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    assert getattr(bad_token, method)(path).status_code == 401


def test_create_stores_the_normalised_spec_and_returns_the_job(api, small_spec):
    response = api.post("/api/jobs/", small_spec, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert {"id", "name", "state", "step", "spec", "owner", "created_at"} <= set(body)
    assert (body["name"], body["state"], body["step"], body["owner"]) == ("t", "queued", 0, "ada")
    # every default is filled in, so the stored spec is exactly what the engine will run
    assert body["spec"]["train"]["steps"] == 6
    assert body["spec"]["train"]["lr"] > 0
    assert body["spec"]["model"]["preset"] == "nano" and body["spec"]["model"]["hidden_size"]
    assert Job.objects.get(pk=body["id"]).spec == body["spec"]


def test_an_invalid_spec_gets_400_naming_every_bad_field(api, small_spec):
    small_spec["train"]["steps"] = "many"
    small_spec["model"]["preset"] = "huge"
    small_spec["parallel"] = {"nodez": 2}
    response = api.post("/api/jobs/", small_spec, format="json")
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert errors["train.steps"] == "must be an integer"
    assert "unknown preset" in errors["model.preset"]
    assert "parallel.nodez" in errors
    assert not Job.objects.exists()


def test_a_spec_that_is_not_an_object_gets_400(api):
    response = api.post("/api/jobs/", [1, 2], format="json")
    assert response.status_code == 400 and response.json()["errors"]


def test_other_users_jobs_are_404_and_staff_see_all(api, user, other_user, small_spec,
                                                   django_user_model):
    theirs = Job.objects.create(name="theirs", owner=other_user, spec=small_spec)
    mine = Job.objects.create(name="mine", owner=user, spec=small_spec)
    for path in ("", "cancel/", "metrics/"):
        method = api.post if path == "cancel/" else api.get
        assert method(f"/api/jobs/{theirs.pk}/{path}").status_code == 404
    assert [j["id"] for j in api.get("/api/jobs/").json()["results"]] == [mine.pk]
    theirs.refresh_from_db()
    assert theirs.cancel_requested_at is None

    staff = django_user_model.objects.create_user("root", password="pw", is_staff=True)
    client = APIClient()
    client.force_authenticate(staff)
    assert {j["id"] for j in client.get("/api/jobs/").json()["results"]} == {mine.pk, theirs.pk}
    assert client.get(f"/api/jobs/{theirs.pk}/").status_code == 200


def test_cancel_records_the_request_and_a_finished_job_answers_409(api, user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    job.start()
    job.mark_running()
    response = api.post(f"/api/jobs/{job.pk}/cancel/")
    assert response.status_code == 202
    job.refresh_from_db()
    assert job.cancel_requested_at is not None and job.cancel_cause == "api_token"

    job.finish_cancel("stopped")
    again = api.post(f"/api/jobs/{job.pk}/cancel/")
    assert again.status_code == 409
    assert again.json() == {"detail": f"job {job.pk} is cancelled; it cannot become cancelled",
                            "state": "cancelled"}


def test_cancelling_a_queued_job_through_the_api_cancels_it_at_once(api, user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    command = api.post(f"/api/jobs/{job.pk}/cancel/").json()
    assert (command["kind"], command["state"], command["requested_by"]) == ("cancel", "done", "ada")
    job.refresh_from_db()
    assert job.state == State.CANCELLED


def test_metrics_returns_every_stored_step_as_series(api, user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    store_events(job.pk, [
        {"type": "step", "job": str(job.pk), "step": s, "time": 1.0 + s, "seq": s,
         "loss": 5.0 - s, "tokens_per_s": 100.0 * s, "memory": {"rss_bytes": 1000 + s}}
        for s in (1, 2, 3)
    ] + [{"type": "step", "job": str(job.pk), "step": 4, "time": 5.0, "seq": 4, "loss": "nan",
          "tokens_per_s": 400.0}])
    series = api.get(f"/api/jobs/{job.pk}/metrics/").json()["series"]
    # at full resolution the envelope is the value itself
    exact = [4.0, 3.0, 2.0, None]
    assert series["loss"] == {"step": [1, 2, 3, 4], "value": exact, "min": exact, "max": exact}
    assert series["tokens_per_s"]["value"] == [100.0, 200.0, 300.0, 400.0]
    assert series["memory.rss_bytes"]["step"] == [1, 2, 3]
    assert series["memory.rss_bytes"]["value"] == [1001.0, 1002.0, 1003.0]
    job.refresh_from_db()
    assert job.step == 4


def test_the_openapi_schema_and_its_docs_page_are_served_without_a_cdn(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert {"/api/jobs/", "/api/jobs/{id}/", "/api/jobs/{id}/cancel/", "/api/jobs/{id}/metrics/",
            "/api/auth/token/"} <= set(paths)
    docs = api.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html
    assert "cdn" not in html.lower()


def test_pages_need_a_login_and_the_home_page_offers_one(client, user):
    home = client.get("/")
    assert home.status_code == 200 and b'name="password"' in home.content
    assert client.get("/jobs/new/").status_code == 302
    logged_in = client.post("/", {"username": "ada", "password": "pw-ada-123"})
    assert logged_in.status_code == 302
    assert b'id="job-rows"' in client.get("/").content  # the list, filled from the API
    new = client.get("/jobs/new/")
    assert new.status_code == 200
    assert b'value="tiny"' in new.content and b'value="small"' in new.content


def test_a_job_page_is_404_for_another_user(client, user, other_user, small_spec):
    theirs = Job.objects.create(name="theirs", owner=other_user, spec=small_spec)
    client.force_login(user)
    assert client.get(f"/jobs/{theirs.pk}/").status_code == 404
    mine = Job.objects.create(name="mine", owner=user, spec=small_spec)
    page = client.get(f"/jobs/{mine.pk}/")
    assert page.status_code == 200 and b"/static/plotly/plotly.min.js" in page.content


def test_logging_in_from_the_home_page_lands_on_the_job_list(client, user):
    response = client.post("/", {"username": "ada", "password": "pw-ada-123"}, follow=True)
    assert response.redirect_chain == [("/", 302)]
    assert b"<h1>Jobs</h1>" in response.content and b'id="job-rows"' in response.content


def test_the_openapi_schema_validates_without_warnings(tmp_path):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", tmp_path / "s.yaml")
    assert "/api/jobs/{id}/cancel/" in (tmp_path / "s.yaml").read_text()



def test_the_command_rules_are_the_engine_contracts_in_lifecycle_order(api):
    response = api.get("/api/commands/")
    assert response.status_code == 200
    rules = response.json()
    assert rules["pause"] == {"allowed_in": ["running"], "moves_to": "pausing"}
    assert rules["resume"] == {"allowed_in": ["paused", "paused_warm"], "moves_to": "queued"}
    assert rules["checkpoint"] == {"allowed_in": ["running"], "moves_to": None}
    assert rules["cancel"] == {"allowed_in": ["queued", "starting", "running", "pausing",
                                              "paused", "paused_warm", "waiting_for_hosts",
                                              "rolling_back", "resharding", "completing"],
                               "moves_to": "cancelled"}
    assert {kind: (set(rule["allowed_in"]), rule["moves_to"]) for kind, rule in rules.items()} \
        == {str(kind): (set(rule.allowed_in), rule.moves_to)
            for kind, rule in COMMAND_RULES.items()}


def test_the_command_rules_need_authentication():
    assert APIClient().get("/api/commands/").status_code == 401


@pytest.mark.parametrize("kind", [k for k in CommandKind if k != CommandKind.DECIDE])
def test_each_steering_action_is_a_method_of_the_viewset_under_its_own_name(kind):
    method = JobViewSet.__dict__[kind]
    assert inspect.isfunction(method) and method.__name__ == kind
    # written in the class body (under its decorators), not made by a factory and renamed
    written = inspect.unwrap(method)
    assert written.__qualname__ == f"JobViewSet.{kind}"
    assert f"def {kind}(self, request" in inspect.getsource(written)
    assert method.mapping == {"post": kind} and method.detail
    assert reverse(f"job-{kind}", args=[7]) == f"/api/jobs/7/{kind}/"


@pytest.mark.parametrize("kind", list(CommandKind))
def test_each_steering_action_reads_its_own_body_through_the_viewsets_serializer(kind):
    method = JobViewSet.__dict__[kind]
    body = method.kwargs["serializer_class"]
    assert issubclass(body, CommandBody)
    view = JobViewSet(**method.kwargs)  # what the router's route makes of the action
    view.action = kind
    assert view.get_serializer_class() is body


def test_a_decision_is_a_method_of_the_viewset_reached_through_its_proposal():
    method = JobViewSet.__dict__["decide"]
    assert "def decide(self, request" in inspect.getsource(inspect.unwrap(method))
    assert method.mapping == {"post": "decide"} and method.detail
    assert reverse("job-proposal-decide", args=[7, "p-8-1"]) == \
        "/api/jobs/7/proposals/p-8-1/decide/"


@pytest.fixture
def checkpointed(user, small_spec, tmp_path) -> Job:
    job = Job.objects.create(name="orig", owner=user, spec=small_spec)
    for seq, tier in [(1, "disk"), (2, "memory")]:
        Checkpoint.objects.create(job=job, seq=seq, step=seq, time=0.0, tier=tier,
                                  path=stored_checkpoint(tmp_path / f"step-{seq}"))
    return job


def test_a_clone_starts_from_the_disk_checkpoint_it_names_under_its_own_name(api, checkpointed):
    disk = checkpointed.stored_checkpoints.get(tier="disk")
    response = api.post(f"/api/jobs/{checkpointed.pk}/clone/",
                        {"name": "copy", "checkpoint": disk.pk}, format="json")
    assert response.status_code == 201, response.json()
    clone = Job.objects.get(pk=response.json()["id"])
    assert (clone.name, clone.resume_from, clone.state) == ("copy", disk.path, "queued")
    assert clone.spec == {**checkpointed.spec, "name": "copy"}


def test_a_clone_without_a_body_is_a_fresh_job_under_the_originals_name(api, checkpointed):
    response = api.post(f"/api/jobs/{checkpointed.pk}/clone/")
    assert response.status_code == 201, response.json()
    clone = Job.objects.get(pk=response.json()["id"])
    assert (clone.name, clone.resume_from) == ("orig", "")
    assert clone.spec == {**checkpointed.spec, "name": "orig"}


def test_a_memory_tier_checkpoint_cannot_seed_a_clone(api, checkpointed):
    memory = checkpointed.stored_checkpoints.get(tier="memory")
    jobs = Job.objects.count()
    response = api.post(f"/api/jobs/{checkpointed.pk}/clone/", {"checkpoint": memory.pk},
                        format="json")
    assert response.status_code == 400
    assert "pick a disk one" in " ".join(response.json()["checkpoint"])
    assert Job.objects.count() == jobs
