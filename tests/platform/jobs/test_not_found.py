"""Another user's job opens the site's own 404 page, with its navigation, as a missing one does."""

import pytest

from jobs.models import Job

pytestmark = pytest.mark.django_db


def test_another_users_job_is_a_styled_404_with_the_navigation(client, settings, user,
                                                               other_user, small_spec):
    settings.DEBUG = False  # as deployed: Django renders 404.html
    theirs = Job.objects.create(name="theirs", owner=other_user, spec=small_spec)
    client.force_login(user)
    for path in (f"/jobs/{theirs.pk}/", "/jobs/999999/"):
        page = client.get(path)
        assert page.status_code == 404
        assert "404.html" in [t.name for t in page.templates]
        html = page.content.decode()
        assert "<h1>Not found</h1>" in html and 'href="/static/css/app.css"' in html
        assert '<a href="/jobs/new/">New job</a>' in html and "<span>ada</span>" in html
        assert "theirs" not in html
