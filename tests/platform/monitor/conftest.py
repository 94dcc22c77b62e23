"""A job and the Redis its events stream through, for the ingest's and the sinks' tests."""

import pytest
import redis

from jobs.models import Job


@pytest.fixture
def job(user, small_spec):
    return Job.objects.create(name="t", owner=user, spec=small_spec)


@pytest.fixture
def bus(platform_redis_url):
    client = redis.Redis.from_url(platform_redis_url)
    yield client
    client.close()
