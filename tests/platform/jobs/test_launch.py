"""The job's error shows no server path outside the job's own run folder and its owner's
uploads (jobs.launch.scrub_paths)."""

from __future__ import annotations

import pytest
from django.conf import settings

from jobs.confinement import uploads_dir
from jobs.launch import SERVER_PATH, run_dir, scrub_paths
from jobs.models import Job

pytestmark = pytest.mark.django_db


def test_paths_outside_the_jobs_own_folders_are_replaced(user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    own, upload = run_dir(job) / "checkpoints" / "step-000002", uploads_dir(user) / "d.jsonl"
    tail = (f'File "{settings.REPO_ROOT}/engine/runtime/data.py", line 3, in load\n'
            f"FileNotFoundError: /etc/ringside/secret (from {own}/MANIFEST.json)\n"
            f"train.dataset.paths: {upload}:7 is not JSON; "
            f"{run_dir(job)}/../7/checkpoints; s3://bucket/x; loss 0.5/step")
    assert scrub_paths(tail, job) == (
        f'File "{SERVER_PATH}", line 3, in load\n'
        f"FileNotFoundError: {SERVER_PATH} (from {own}/MANIFEST.json)\n"
        f"train.dataset.paths: {upload}:7 is not JSON; "
        f"{SERVER_PATH}; s3://bucket/x; loss 0.5/step")
