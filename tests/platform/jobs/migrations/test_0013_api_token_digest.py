"""The migration to token digests keeps the keys users already hold working."""

import importlib

import pytest
from django.apps import apps
from rest_framework.test import APIClient

from jobs.models import ApiToken

pytestmark = pytest.mark.django_db

migration = importlib.import_module("jobs.migrations.0013_api_token_digest")


def test_a_key_stored_in_clear_before_the_migration_authenticates_after_it(user):
    key = "0123456789abcdef0123456789abcdef01234567"  # a key of the old format, in clear
    old = ApiToken.objects.create(user=user, name="from before")
    ApiToken.objects.filter(pk=old.pk).update(digest=key)  # the row as the old schema had it
    migration.hash_keys(apps, None)
    assert key not in ApiToken.objects.get(pk=old.pk).digest
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/jobs/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION=f"Token {ApiToken.objects.get(pk=old.pk).digest}")
    assert client.get("/api/jobs/").status_code == 401  # the stored digest is no key
