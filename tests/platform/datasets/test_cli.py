"""`ringside datasets add/prepare/list/show` against the real web server and worker: a dataset
registered from the command line, prepared with --follow to ready (exit 0), read back by
name; refusals print the API's message naming the field and exit 5."""

from __future__ import annotations

import json

import pytest

from tests.platform.datasets.test_prepare import corpus
from tests.platform.isolation.test_paths import upload

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_dataset_is_added_prepared_and_shown_from_the_command_line(ringside, api,
                                                                     celery_worker):
    upload(api, "web.jsonl", corpus(200))
    refused = ringside("datasets", "add", "web", "/etc/passwd", "--kind", "jsonl")
    assert refused.code == 5 and "sources.0.paths.0: not under your data roots" in refused.err
    added = json.loads(ringside("--json", "datasets", "add", "web", "*.jsonl", "--kind", "jsonl",
                                "--holdout", "0.05").out)
    assert added["state"] == "registered" and added["sources"][0]["paths"][0].endswith(
        "/*.jsonl")
    run = ringside("datasets", "prepare", "web", "--follow")
    assert run.code == 0, run.err
    assert "ready" in run.out and "vocabulary" in run.out and "256" in run.out
    again = ringside("datasets", "prepare", added["id"])
    assert again.code == 5 and "dataset 'web' is prepared already" in again.err
    listed = ringside("datasets", "list")
    assert listed.code == 0 and "web" in listed.out and "ready" in listed.out
    shown = json.loads(ringside("--json", "datasets", "show", "web").out)
    splits = shown["manifest"]["splits"]
    assert splits["train"]["documents"] + splits["heldout"]["documents"] == 200
    assert ringside("datasets", "show", "nothing").code == 5
