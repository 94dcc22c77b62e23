"""Two non-staff users (ada: `api`, the attacker; bob: `bob_api`, whose work is attacked) and
staff, each with an API client of their own."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from jobs.models import ApiToken


def client_of(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {ApiToken.objects.create(user=user).key}")
    return client


@pytest.fixture
def bob_api(other_user) -> APIClient:
    return client_of(other_user)


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("root", password="pw-root-123", is_staff=True)


@pytest.fixture
def staff_api(staff) -> APIClient:
    return client_of(staff)


def checksums(folder: Path) -> dict[str, str]:
    """Every file under `folder` by relative path, with the SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}
