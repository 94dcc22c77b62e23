"""The sinks' API: `sinks` on job create, the job's sinks in its detail, the user's default
sinks, and tracker tokens that are stored encrypted and never answered in clear."""

import pytest

from monitor.sinks import secrets
from monitor.sinks.models import Secret, Sink

pytestmark = pytest.mark.django_db

KEY = "wandb-key-0123456789abcdef"


def test_a_job_writes_to_the_sinks_its_body_names_and_its_detail_shows_them(api, small_spec):
    created = api.post("/api/jobs/", {**small_spec, "sinks": [
        "tensorboard", {"kind": "wandb", "mode": "offline", "project": "moe"}]}, format="json")
    assert created.status_code == 201, created.json()
    sinks = created.json()["sinks"]
    assert [(s["kind"], s["config"], s["state"]) for s in sinks] == [
        ("tensorboard", {"kind": "tensorboard"}, "waiting"),
        ("wandb", {"kind": "wandb", "mode": "offline", "project": "moe"}, "waiting")]
    assert "sinks" not in created.json()["spec"]
    detail = api.get(f"/api/jobs/{created.json()['id']}/").json()
    assert [s["kind"] for s in detail["sinks"]] == ["tensorboard", "wandb"]


def test_bad_sinks_answer_400_naming_each_field(api, small_spec):
    response = api.post("/api/jobs/", {**small_spec, "sinks": [
        "neptune", {"kind": "wandb", "mode": "cloud"}, "tensorboard", "tensorboard",
        {"kind": "mlflow", "tracking_uri": "http://169.254.169.254/", "token": "x"}]},
        format="json")
    assert response.status_code == 400
    assert response.json()["errors"] == {
        "sinks.0.kind": "unknown tracker 'neptune'; known: tensorboard, mlflow, wandb",
        "sinks.1.mode": "must be one of offline, online",
        "sinks.3": "tensorboard is named twice",
        "sinks.4.token": "not a field of a mlflow sink; its fields: tracking_uri, experiment",
        "sinks.4.tracking_uri": "not a public address"}
    assert not Sink.objects.exists()


def test_a_job_without_sinks_gets_its_owners_defaults(api, small_spec):
    assert api.get("/api/me/sinks/").json() == {"sinks": []}
    refused = api.put("/api/me/sinks/", {"sinks": [{"kind": "tensorboard", "dir": "/etc"}]},
                      format="json")
    assert refused.status_code == 400
    assert refused.json()["sinks.0.dir"] == ["not a field of a tensorboard sink; its fields: none"]
    saved = api.put("/api/me/sinks/", {"sinks": ["tensorboard"]}, format="json")
    assert saved.json() == {"sinks": [{"kind": "tensorboard"}]}
    job = api.post("/api/jobs/", small_spec, format="json").json()
    assert [s["kind"] for s in job["sinks"]] == ["tensorboard"]
    named_none = api.post("/api/jobs/", {**small_spec, "sinks": []}, format="json").json()
    assert named_none["sinks"] == []


def test_a_secret_is_stored_encrypted_and_never_answered_in_clear(api, user, other_user):
    response = api.put("/api/me/secrets/wandb_api_key/", {"value": KEY}, format="json")
    assert response.status_code == 200
    assert KEY not in response.content.decode()
    listing = api.get("/api/me/secrets/")
    assert [s["name"] for s in listing.json()] == ["wandb_api_key"]
    assert KEY not in listing.content.decode()
    stored = bytes(Secret.objects.get(owner=user).ciphertext)
    assert KEY.encode() not in stored
    assert secrets.reveal(user.pk, "wandb_api_key") == KEY
    assert secrets.reveal(other_user.pk, "wandb_api_key") is None
    assert api.put("/api/me/secrets/password/", {"value": "x"},
                   format="json").status_code == 404
    assert api.delete("/api/me/secrets/wandb_api_key/").status_code == 204
    assert secrets.reveal(user.pk, "wandb_api_key") is None


def test_a_secret_under_another_server_key_is_unset_rather_than_an_error(user, settings):
    secrets.store(user.pk, "mlflow_token", "t0ken")
    settings.SECRET_KEY = "another key"
    assert secrets.reveal(user.pk, "mlflow_token") is None
