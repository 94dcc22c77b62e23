"""The launch form as a clone (`/jobs/new/?clone=<id>`): it embeds the job's spec, the preset
its model started from and the fields set apart from that preset; only for a job the user may
see."""

import json
import re

import pytest

from engine.runtime.spec import parse_spec
from jobs.models import Job
from jobs.policy import PlatformPolicy

pytestmark = pytest.mark.django_db


def embedded_clone(html: bytes) -> dict:
    found = re.search(rb'<script id="clone-from" type="application/json">(.*?)</script>', html)
    return json.loads(found.group(1))


def test_the_clone_form_embeds_the_spec_and_the_model_fields_apart_from_the_preset(client, user):
    # ling-lite is not one of the form's presets: the clone's form offers it anyway
    spec = parse_spec({"name": "mine", "model": {"preset": "ling-lite", "num_hidden_layers": 3},
                       "train": {"steps": 9}}).to_dict()
    job = Job.objects.create(name="mine", owner=user, spec=spec)
    client.force_login(user)
    page = client.get(f"/jobs/new/?clone={job.pk}")
    assert page.status_code == 200
    # the spec as it was, under the next free name
    assert embedded_clone(page.content) == {"id": job.pk, "spec": {**spec, "name": "mine-2"},
                                            "preset": "ling-lite",
                                            "model_overrides": {"num_hidden_layers": 3}}
    assert b'<option value="ling-lite">' in page.content


def test_cloning_another_users_job_or_no_job_is_404(client, user, other_user, small_spec):
    theirs = Job.objects.create(name="theirs", owner=other_user, spec=small_spec)
    client.force_login(user)
    for query in (theirs.pk, "abc", 10**9):
        assert client.get(f"/jobs/new/?clone={query}").status_code == 404


def test_the_form_offers_the_platform_policy_with_its_defaults_and_what_the_limit_counts(
        client, user, api, small_spec):
    client.force_login(user)
    html = client.get("/jobs/new/").content.decode()
    defaults = PlatformPolicy()
    for name, value in defaults.to_dict().items():
        assert re.search(rf'name="platform\.{name}"[^>]*value="{value}"', html), name
    assert "only actions since the job last resumed count" in html
    # the names the form sends are the ones the API's errors name
    bad = api.post("/api/jobs/", {**small_spec, "platform": {"max_auto_actions_per_hour": -1}},
                   format="json")
    assert bad.status_code == 400
    assert bad.json()["errors"] == {
        "platform.max_auto_actions_per_hour": "must be a non-negative integer"}
