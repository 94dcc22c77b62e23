"""The job page's Trackers card: each sink's state and the error it fails with."""

import pytest

from jobs.models import Job
from monitor.sinks.models import Sink, SinkKind, SinkState

pytestmark = pytest.mark.django_db


def test_the_job_page_shows_each_sinks_state_and_error(client, user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec)
    client.force_login(user)
    assert 'id="sinks"' not in client.get(f"/jobs/{job.pk}/").content.decode()
    Sink.objects.create(job=job, kind=SinkKind.TENSORBOARD, state=SinkState.WRITING, last_seq=7)
    Sink.objects.create(job=job, kind=SinkKind.MLFLOW, state=SinkState.FAILING,
                        last_error="ConnectionError: <refused>")
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="sinks"' in page
    assert "up to date with the events read" in page and "to event 7" in page
    assert "ConnectionError: &lt;refused&gt;" in page  # escaped, as every text it shows
