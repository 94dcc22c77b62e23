"""The token page answers a creation with a redirect (a reload does not create a second
token) and shows the new key once; the launch form of a clone proposes the next free name."""

import json
import re

import pytest

from jobs.models import ApiToken, Job, token_digest

pytestmark = pytest.mark.django_db


def test_a_new_token_redirects_and_its_key_is_shown_once(client, user):
    client.force_login(user)
    created = client.post("/tokens/", {"name": "laptop"})
    assert created.status_code == 302 and created["Location"] == "/tokens/"
    shown = client.get("/tokens/").content.decode()
    key = re.search(r'<code id="new-token">([0-9a-f]{40})</code>', shown)[1]
    assert 'id="copy-token"' in shown
    assert ApiToken.objects.get(user=user, name="laptop").digest == token_digest(key)
    assert key not in client.get("/tokens/").content.decode()  # once only
    assert ApiToken.objects.filter(user=user).count() == 1


def test_a_refused_token_name_answers_400_with_the_form(client, user):
    client.force_login(user)
    response = client.post("/tokens/", {"name": ""})
    assert response.status_code == 400 and b'id="token-error"' in response.content
    assert not ApiToken.objects.exists()


def proposed_name(client, job: Job) -> str:
    page = client.get(f"/jobs/new/?clone={job.pk}").content.decode()
    clone = re.search(r'<script id="clone-from"[^>]*>(.*?)</script>', page, re.S)
    return json.loads(clone.group(1))["spec"]["name"]


def test_a_clone_proposes_the_next_free_suffix(client, user, other_user, small_spec):
    client.force_login(user)
    run = Job.objects.create(name="run", owner=user, spec={**small_spec, "name": "run"})
    assert proposed_name(client, run) == "run-2"
    Job.objects.create(name="run-2", owner=user, spec=small_spec)
    Job.objects.create(name="run-3", owner=other_user, spec=small_spec)  # not the user's
    assert proposed_name(client, run) == "run-3"
    four = Job.objects.create(name="run-4", owner=user, spec=small_spec)
    assert proposed_name(client, four) == "run-3"
