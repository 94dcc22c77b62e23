"""Fixtures of the jobs tests."""

from __future__ import annotations

import pytest

from jobs.models import Job


@pytest.fixture
def running(user, small_spec) -> Job:
    """A job its supervisor reported running (no engine behind it)."""
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    job.start(supervisor="test")
    job.mark_running()
    return job
