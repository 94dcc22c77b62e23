"""The Hosts page renders for a signed-in user (drain buttons only for staff, decided by the
page's `data-staff`), is linked in the nav, and sends visitors to the login."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("session_worker_host_hidden")]


def test_the_hosts_page_is_linked_and_marks_staff(client, user, django_user_model):
    assert client.get("/hosts/").status_code == 302
    client.force_login(user)
    page = client.get("/hosts/").content.decode()
    assert 'href="/hosts/"' in page and 'data-staff=""' in page and "js/hosts.js" in page
    client.force_login(django_user_model.objects.create_user("root", is_staff=True))
    assert 'data-staff="1"' in client.get("/hosts/").content.decode()
