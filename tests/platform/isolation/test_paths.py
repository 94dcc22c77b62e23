"""What a job spec may name on the platform (jobs.confinement), replayed as the attacks of the
isolation issue by ada (non-staff) against bob's work and the server's files: each refused
with a 400 naming the field, in words that do not tell whether an outside path exists, and no
job created; what a user may read (their uploads, the operator's roots, a checkpoint they may
read) is accepted at its real path."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
from django.conf import settings

from engine.runtime.confine import NO_MATCH, OUTSIDE
from jobs.confinement import CHECKPOINT_DIR, uploads_dir
from jobs.models import Checkpoint, Job
from tests.platform.services import SMALL_SPEC, stored_checkpoint

pytestmark = pytest.mark.django_db


def spec_with(dataset: dict | None = None, **sections) -> dict:
    spec = copy.deepcopy(SMALL_SPEC)
    if dataset is not None:
        spec["train"]["dataset"] = dataset
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values}
    return spec


def errors_of(client, spec: dict) -> dict[str, str]:
    before = Job.objects.count()
    answer = client.post("/api/jobs/", spec, format="json")
    assert answer.status_code == 400, answer.json()
    assert Job.objects.count() == before
    return answer.json()["errors"]


def upload(client, name: str, text: str) -> dict:
    from django.core.files.uploadedfile import SimpleUploadedFile

    answer = client.post("/api/files/", {"file": SimpleUploadedFile(name, text.encode())},
                         format="multipart")
    assert answer.status_code == 201, answer.json()
    return answer.json()


@pytest.fixture
def outside_paths(bob_api, other_user, tmp_path) -> list[str]:
    """Files the server holds that ada must not read (some there, some not), as a spec may
    spell them: absolute, relative out of her uploads folder, through a link, as a glob."""
    bob_notes = upload(bob_api, "notes.txt", "bob's own data " * 100)["path"]
    link = uploads_dir_of_ada(tmp_path)
    return [
        str(settings.REPO_ROOT / "platform" / "ringside" / "settings.py"), "/etc/passwd",
        "/etc/no-such-file", str(settings.REPO_ROOT / "no-such-file"), "/etc/*",
        "/no-such-folder/*.txt", bob_notes, f"../{other_user.pk}/notes.txt",
        f"../{other_user.pk}/missing.txt", link, f"{link}/../settings.py",
    ]


def uploads_dir_of_ada(tmp_path: Path) -> str:
    """A link planted in ada's uploads folder to the server's settings."""
    from django.contrib.auth import get_user_model

    folder = uploads_dir(get_user_model().objects.get(username="ada"))
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "settings-link.txt"
    link.unlink(missing_ok=True)
    link.symlink_to(settings.REPO_ROOT / "platform" / "ringside" / "settings.py")
    return str(link)


def test_dataset_paths_outside_the_roots_are_refused_alike_there_or_not(api, outside_paths):
    for path in outside_paths:
        spec = spec_with({"kind": "text", "paths": [path]})
        assert errors_of(api, spec) == {"train.dataset.paths.0": OUTSIDE}, path


def test_tokenizers_outside_the_roots_are_refused_alike_there_or_not(api, outside_paths):
    upload(api, "mine.txt", "ada's text " * 100)
    for path in outside_paths:
        spec = spec_with({"kind": "text", "paths": ["mine.txt"], "tokenizer": path})
        assert errors_of(api, spec) == {"train.dataset.tokenizer": OUTSIDE}, path


def test_a_glob_matching_nothing_in_the_roots_says_so_without_the_pattern(api):
    errors = errors_of(api, spec_with({"kind": "text", "paths": ["missing-*.txt"]}))
    assert errors == {"train.dataset.paths.0": NO_MATCH}


def test_uploads_and_the_operators_roots_are_read_at_their_real_paths(api, user):
    upload(api, "a.txt", "ada's text " * 100)
    stdlib = os.path.join(settings.DATA_ROOTS[0], "json", "*.py")
    answer = api.post("/api/jobs/", spec_with({"kind": "text",
                                               "paths": ["a.txt", "*.txt", stdlib]}),
                      format="json")
    assert answer.status_code == 201, answer.json()
    real = os.path.realpath(uploads_dir(user))
    assert answer.json()["spec"]["train"]["dataset"]["paths"] == [
        f"{real}/a.txt", f"{real}/*.txt", os.path.join(os.path.realpath(settings.DATA_ROOTS[0]),
                                                        "json", "*.py")]


def test_a_spec_cannot_set_its_own_data_roots(api):
    assert errors_of(api, spec_with(data={"roots": ["/"]}))["data"].startswith(
        "set by the platform")


def test_checkpoint_dir_is_refused_naming_it_and_nothing_is_created(api, other_user, tmp_path):
    bobs = Job.objects.create(name="b", owner=other_user, spec=SMALL_SPEC)
    runs_before = set(settings.RUNS_DIR.rglob("*"))
    for folder in (str(settings.RUNS_DIR / str(bobs.pk) / "checkpoints"),
                   str(tmp_path / "elsewhere"), "s3://bucket/anywhere"):
        assert errors_of(api, spec_with(checkpoint={"dir": folder})) == {
            "checkpoint.dir": CHECKPOINT_DIR}
    assert not (tmp_path / "elsewhere").exists()
    assert set(settings.RUNS_DIR.rglob("*")) == runs_before


def bobs_checkpoint(other_user) -> tuple[Job, Checkpoint]:
    job = Job.objects.create(name="b", owner=other_user, spec=SMALL_SPEC)
    path = stored_checkpoint(settings.RUNS_DIR / str(job.pk) / "checkpoints" / "step-000002")
    return job, Checkpoint.objects.create(job=job, seq=1, step=2, time=0.0, tier="disk",
                                          path=path)


def test_init_from_another_users_checkpoint_reads_as_a_missing_one(api, other_user):
    job, found = bobs_checkpoint(other_user)
    by_id = errors_of(api, spec_with(model={"init_from": {"job": job.pk,
                                                          "checkpoint": found.pk}}))
    assert by_id == {"model.init_from": f"job {job.pk} has no checkpoint {found.pk}"}
    missing = errors_of(api, spec_with(model={"init_from": {"job": job.pk + 1000,
                                                            "checkpoint": found.pk}}))
    assert missing == {"model.init_from": f"job {job.pk + 1000} has no checkpoint {found.pk}"}
    assert errors_of(api, spec_with(model={"init_from": found.path})) == {
        "model.init_from": OUTSIDE}


def test_a_checkpoint_one_may_read_seeds_a_job_by_its_ids(staff_api, other_user):
    job, found = bobs_checkpoint(other_user)
    answer = staff_api.post("/api/jobs/", spec_with(
        model={"init_from": {"job": job.pk, "checkpoint": found.pk}}), format="json")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["spec"]["model"]["init_from"] == found.path


def test_a_clone_is_checked_again(api, bob_api, user):
    # a spec stored by older code, which let checkpoint.dir through
    old = Job.objects.create(name="old", owner=user,
                             spec=spec_with(checkpoint={"dir": "/tmp/anywhere"}))
    answer = api.post(f"/api/jobs/{old.pk}/clone/", {}, format="json")
    assert answer.status_code == 400
    assert answer.json()["errors"] == {"checkpoint.dir": CHECKPOINT_DIR}
    assert bob_api.post(f"/api/jobs/{old.pk}/clone/", {}, format="json").status_code == 404
