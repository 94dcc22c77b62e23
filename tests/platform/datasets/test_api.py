"""The datasets API (datasets.api): registering with paths confined to the user's data roots
(the isolation issue's attacks replayed on a dataset's sources and tokenizer), ownership (404
for another user's, shared ones readable by all and changed by their owner), and a dataset a
running job trains on kept (409 naming the job)."""

from __future__ import annotations

import json
import os

import pytest
from django.conf import settings

from datasets.models import Dataset, DatasetState
from engine.runtime.confine import NO_MATCH, OUTSIDE
from jobs.confinement import uploads_dir
from jobs.models import Job, State
from tests.platform.isolation.test_paths import upload
from tests.platform.services import SMALL_SPEC

pytestmark = pytest.mark.django_db


def body(*paths: str, kind: str = "jsonl", **fields) -> dict:
    return {"name": "web", "sources": [{"kind": kind, "paths": list(paths), "field": "text"}],
            **fields}


def register(client, data: dict, status: int = 201) -> dict:
    answer = client.post("/api/datasets/", data, format="json")
    assert answer.status_code == status, answer.json()
    return answer.json()


def test_a_dataset_is_registered_with_its_sources_at_their_real_paths(api, user):
    upload(api, "a.jsonl", json.dumps({"text": "hello"}) + "\n")
    stdlib = os.path.join(settings.DATA_ROOTS[0], "json", "*.py")
    made = register(api, {"name": "mixed", "holdout": 0.05, "sources": [
        {"kind": "jsonl", "paths": ["*.jsonl"], "field": "text"},
        {"kind": "text", "paths": [stdlib]}]})
    real = os.path.realpath(uploads_dir(user))
    assert made["state"] == DatasetState.REGISTERED and made["owner"] == "ada"
    assert made["sources"] == [
        {"kind": "jsonl", "paths": [f"{real}/*.jsonl"], "field": "text"},
        {"kind": "text", "paths": [os.path.join(os.path.realpath(settings.DATA_ROOTS[0]),
                                                "json", "*.py")], "field": "text"}]
    assert made["tokenizer"] == "bytes" and made["holdout"] == 0.05
    assert [d["name"] for d in api.get("/api/datasets/").json()["results"]] == ["mixed"]
    assert register(api, {"name": "mixed", "sources": made["sources"]}, 400) == {
        "name": ["you have a dataset named 'mixed' already"]}


def test_source_paths_outside_the_roots_are_refused_alike_there_or_not(api, outside_paths):
    for path in outside_paths:
        assert register(api, body(path), 400) == {"sources.0.paths.0": [OUTSIDE]}, path
    assert register(api, body("missing-*.jsonl"), 400) == {"sources.0.paths.0": [NO_MATCH]}
    assert not Dataset.objects.exists()


def test_a_tokenizer_outside_the_roots_is_refused_alike_there_or_not(api, outside_paths):
    upload(api, "a.jsonl", "{}\n")
    for path in outside_paths:
        answer = register(api, body("a.jsonl", tokenizer=path), 400)
        assert list(answer) == ["tokenizer"], path
    upload(api, "tokenizer.json", "{}")
    assert register(api, body("a.jsonl", tokenizer="tokenizer.json"))["tokenizer"].endswith(
        "/tokenizer.json")


def test_an_object_store_prefix_is_read_only_where_the_operator_opened_it(api, settings):
    for url in ("s3://bucket/corpus/*.parquet", "s3://other/x", "s3://bucket/open/../secret"):
        assert register(api, body(url), 400) == {"sources.0.paths.0": [OUTSIDE]}, url
    settings.DATA_ROOTS = [*settings.DATA_ROOTS, "s3://bucket/open"]
    made = register(api, body("s3://bucket/open/web/", kind="parquet"))
    assert made["sources"][0]["paths"] == ["s3://bucket/open/web/"]
    assert register(api, {**body("s3://bucket/open/../secret/"), "name": "b"}, 400) == {
        "sources.0.paths.0": [OUTSIDE]}


def test_bad_fields_are_named(api):
    upload(api, "a.jsonl", "{}\n")
    answer = register(api, {"name": "../x", "holdout": 0.9, "sources": [
        {"kind": "csv", "paths": ["a.jsonl"]}]}, 400)
    assert set(answer) == {"name", "holdout", "sources.0.kind"}
    assert register(api, {"name": "x", "sources": []}, 400) == {
        "sources": ["This list may not be empty."]}


def test_another_users_dataset_answers_404_and_a_shared_one_is_read_not_changed(
        api, bob_api, staff_api, other_user, prepared):
    bobs = prepared(other_user, "bobs")
    for call in (api.get, api.delete, api.post):
        path = f"/api/datasets/{bobs.pk}/" + ("prepare/" if call == api.post else "")
        assert call(path).status_code == 404, path
    assert api.get("/api/datasets/").json()["results"] == []
    assert register(api, {**body("x"), "shared": True}, 400)["shared"] == [
        "only staff share a dataset with everyone"]
    assert api.patch(f"/api/datasets/{bobs.pk}/", {"shared": True}).status_code == 404
    assert staff_api.patch(f"/api/datasets/{bobs.pk}/", {"shared": True},
                           format="json").json()["shared"] is True
    assert api.get(f"/api/datasets/{bobs.pk}/").json()["name"] == "bobs"
    assert api.delete(f"/api/datasets/{bobs.pk}/").status_code == 403
    assert api.patch(f"/api/datasets/{bobs.pk}/", {"shared": False}).status_code == 403


def test_a_dataset_an_unfinished_job_trains_on_is_not_deleted(api, user, prepared):
    dataset = prepared(user)
    os.makedirs(dataset.folder)
    spec = {**SMALL_SPEC, "train": {**SMALL_SPEC["train"],
                                    "data": {"mix": [{"dataset": "web"}]}}}
    job_id = api.post("/api/jobs/", spec, format="json").json()["id"]
    answer = api.delete(f"/api/datasets/{dataset.pk}/")
    assert answer.status_code == 409
    assert answer.json()["detail"] == (f"dataset 'web' is in use by unfinished job(s) {job_id}: "
                                       "cancel them or let them finish")
    assert api.get(f"/api/datasets/{dataset.pk}/").json()["in_use_by"] == [job_id]
    Job.objects.filter(pk=job_id).update(state=State.COMPLETED)
    assert api.delete(f"/api/datasets/{dataset.pk}/").status_code == 204
    assert not os.path.exists(dataset.folder)


def test_a_prepared_dataset_is_not_prepared_again(api, user, prepared):
    dataset = prepared(user)
    answer = api.post(f"/api/datasets/{dataset.pk}/prepare/")
    assert answer.status_code == 409
    assert answer.json() == {"detail": "dataset 'web' is prepared already"}
