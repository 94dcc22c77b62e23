"""The engine's launcher runs with the environment it needs and none of the platform's
secrets: a training run executes what a user's spec and data make it do."""

import signal

import pytest

from jobs.launch import kill_group, start_engine
from jobs.models import Job
from ringside.services import PLATFORM_SECRETS

pytestmark = pytest.mark.django_db


def test_the_engine_gets_no_secret_key_admin_password_or_database_url(
        user, small_spec, monkeypatch):
    for name in PLATFORM_SECRETS:
        monkeypatch.setenv(name, f"secret-{name}")
    job = Job.objects.create(name="env", owner=user, spec=small_spec)
    proc = start_engine(job, job.spec)
    try:
        # Popen returns once the launcher has exec'd: this is the environment it runs with
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            names = {item.split(b"=", 1)[0].decode() for item in f.read().split(b"\0") if item}
    finally:
        kill_group(proc, signal.SIGKILL)
        proc.wait()
    assert not names & set(PLATFORM_SECRETS)
    assert {"PATH", "PYTHONPATH"} <= names  # what it does need is still there
