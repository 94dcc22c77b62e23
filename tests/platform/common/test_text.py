"""common.text and where the API applies it: a lone surrogate or a control character in any
string of a job spec (keys too), its name, its tags or its note is a 400 naming the field; a
note keeps its newlines and tabs. Rows that older code stored with a lone surrogate still list
and show (200)."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from rest_framework.test import APIClient

from common.text import text_error, text_errors
from jobs.models import ApiToken, Job

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("value, prose, bad", [
    ("plain ascii and ünïcödé ✓ 😀", False, None),
    ("line\nbreak", True, None), ("tab\there", True, None),
    ("line\nbreak", False, "control character (U+000A)"),
    ("nul\x00", True, "control character (U+0000)"),
    ("bell\x07", True, "control character (U+0007)"),
    ("c1\x85", True, "control character (U+0085)"),
    ("del\x7f", False, "control character (U+007F)"),
    ("lone \ud800", True, "lone surrogate (U+D800)"),
    ("low \udfff", False, "lone surrogate (U+DFFF)"),
])
def test_text_error_names_what_is_wrong(value, prose, bad):
    error = text_error(value, prose=prose)
    assert (error is None) if bad is None else (bad in error)


def test_text_errors_name_each_dotted_path_keys_included():
    errors = text_errors({"model": {"preset": "nano"}, "train": {"dataset": {
        "paths": ["ok", "bad\x1b[31m"]}}, "tags": {"k\ud800": 1}})
    assert set(errors) == {"train.dataset.paths.1", "tags.'k\\ud800'"}
    assert errors["tags.'k\\ud800'"].startswith("the key holds a lone surrogate")


def post_raw(api: APIClient, path: str, body: dict, method: str = "POST"):
    # json.dumps escapes the surrogate (\ud800), as a client that sends it would
    return api.generic(method, path, json.dumps(body), content_type="application/json")


@pytest.mark.parametrize("field, value", [
    ("name", "job\ud800"), ("name", "job\x1b"),
    ("train.dataset.kind", "text\ud83d"), ("model.preset", "nano\x00"),
    ("checkpoint.dir", "/tmp/x\ud800"), ("train.dataset.tokenizer", "/tmp/tok\ud800"),
])
def test_a_spec_string_that_is_not_text_is_a_400_naming_it(api, small_spec, field, value):
    section, _, key = field.rpartition(".")
    target = small_spec
    for part in filter(None, section.split(".")):
        target = target.setdefault(part, {})
    target[key] = value
    answer = post_raw(api, "/api/jobs/", small_spec)
    assert answer.status_code == 400
    assert "only UTF-8 text without control characters" in answer.json()["errors"][field]
    assert not Job.objects.exists()


@pytest.mark.parametrize("body, field", [
    ({"note": "a\ud800b"}, "note"), ({"note": "bell\x07"}, "note"),
    ({"tags": ["ok", "t\ud800"]}, "tags"), ({"tags": ["t\x01"]}, "tags"),
])
def test_a_tag_or_note_that_is_not_text_is_a_400_naming_it(api, user, small_spec, body, field):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    answer = post_raw(api, f"/api/jobs/{job.pk}/", body, method="PATCH")
    assert answer.status_code == 400
    assert field in answer.json()
    job.refresh_from_db()
    assert (job.tags, job.note) == ([], "")
    kept = post_raw(api, f"/api/jobs/{job.pk}/", {"note": "two\nlines\tand a tab"}, "PATCH")
    assert kept.status_code == 200 and kept.json()["note"] == "two\nlines\tand a tab"


def test_a_clone_name_that_is_not_text_is_a_400_naming_it(api, user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    answer = post_raw(api, f"/api/jobs/{job.pk}/clone/", {"name": "c\ud800"})
    assert answer.status_code == 400 and "name" in answer.json()


def test_rows_older_code_stored_with_text_it_now_refuses_still_list_and_show(
        api, user, small_spec, django_user_model):
    # what the create endpoint stored before it checked text: SQLite's JSON keeps a lone
    # surrogate's escape; PostgreSQL's jsonb refuses one (so older code never stored it there),
    # but keeps control characters
    bad = "x\ud800y" if connection.vendor == "sqlite" else "x\x1b[31my"
    spec = {**small_spec, "train": {**small_spec["train"],
                                    "dataset": {"kind": "text", "paths": [bad]}}}
    job = Job.objects.create(name="old", owner=user, spec=spec, tags=[f"old{bad}"])
    root = django_user_model.objects.create_user("root", password="pw-root-123", is_staff=True)
    staff = APIClient()
    staff.credentials(HTTP_AUTHORIZATION=f"Token {ApiToken.objects.create(user=root).key}")
    for client in (api, staff):
        listed = client.get("/api/jobs/")
        assert listed.status_code == 200
        assert json.loads(listed.content)["results"][0]["spec"]["train"]["dataset"][
            "paths"] == [bad]
        shown = client.get(f"/api/jobs/{job.pk}/")
        assert shown.status_code == 200
        assert json.loads(shown.content)["tags"] == [f"old{bad}"]
