"""Uploads (`/api/files/`): a file lands in its owner's folder under a plain name, within the
size limit, listed to its owner only; a name that would leave the folder or hide is refused
naming the field, and another user can neither list nor read it in a spec."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from engine.runtime.confine import OUTSIDE
from jobs.confinement import uploads_dir
from tests.platform.isolation.conftest import client_of
from tests.platform.isolation.test_paths import errors_of, spec_with

pytestmark = pytest.mark.django_db


def post(client, data: bytes, filename: str = "data.txt", **fields):
    return client.post("/api/files/", {"file": SimpleUploadedFile(filename, data), **fields},
                       format="multipart")


def test_an_upload_is_stored_in_its_owners_folder_and_listed_to_them(api, user):
    answer = post(api, b"hello " * 100)
    assert answer.status_code == 201, answer.json()
    path = uploads_dir(user) / "data.txt"
    assert answer.json() == {"name": "data.txt", "path": str(path), "size": 600}
    assert path.read_bytes() == b"hello " * 100
    assert post(api, b"again", name="data.txt").json()["size"] == 5  # replaced
    assert api.get("/api/files/").json() == [{"name": "data.txt", "path": str(path), "size": 5}]


def test_names_that_leave_the_folder_or_hide_are_refused(api, user, tmp_path):
    for name in ("../escape.txt", "a/b.txt", "..", ".hidden", "/etc/passwd", "a\\b"):
        answer = post(api, b"x", name=name)
        assert answer.status_code == 400, name
        assert set(answer.json()) == {"name"}
    # a multipart file name is cut to its last part by Django before the view sees it
    assert post(api, b"x", filename="../../escape.txt").json()["path"] == str(
        uploads_dir(user) / "escape.txt")
    assert post(api, b"x", filename=".bashrc").json() == {"file": [
        "a plain file name: letters, digits, '_', '.', '+' or '-', not starting with '.', "
        "no folders"]}
    assert {str(p.relative_to(settings.UPLOADS_DIR)) for p in settings.UPLOADS_DIR.rglob("*")
            } == {str(user.pk), f"{user.pk}/escape.txt"}


def test_a_file_over_the_limit_is_refused_naming_the_field(api, user, settings):
    settings.UPLOAD_MAX_BYTES = 1000
    answer = post(api, b"x" * 1001)
    assert answer.status_code == 400
    assert answer.json() == {"file": ["over the upload limit of 1000 bytes"]}
    too_big = post(api, b"x" * (1000 + (64 << 10)))  # refused before it is read
    assert too_big.status_code == 413 and set(too_big.json()) == {"file"}
    assert not uploads_dir(user).exists() or not any(uploads_dir(user).iterdir())


def test_other_users_cannot_see_or_use_your_uploads(api, other_user):
    path = post(api, b"ada's data " * 100).json()["path"]
    bob = client_of(other_user)
    assert bob.get("/api/files/").json() == []
    assert errors_of(bob, spec_with({"kind": "text", "paths": [path]})) == {
        "train.dataset.paths.0": OUTSIDE}
