"""The Hosts page: a row per host with its devices, slots and state; a host's beat reaching
the page over `/ws/hosts/` turns a lost row up again without a reload; a silent host's row
turns lost as its beat ages on the page; staff drain and undrain from the row."""

import threading
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from hosts import live, registry
from hosts.models import Host
from tests.e2e.session import log_in

pytestmark = pytest.mark.django_db(transaction=True)


def announce(name: str) -> None:
    """hosts.live.publish, as a worker calls it: from a thread without an event loop (this one
    runs Playwright's)."""
    thread = threading.Thread(target=live.publish, args=(name,))
    thread.start()
    thread.join(10)


def make_host(name: str, beat_s_ago: float) -> Host:
    return Host.objects.create(name=name, address="10.0.0.7", slots=8, instance="x",
                               version=registry.version(),
                               devices={"cpu": {"cores": 4, "memory_bytes": 2**33}, "gpus": []},
                               beat_at=timezone.now() - timedelta(seconds=beat_s_ago))


def test_the_hosts_page_follows_beats_and_staff_drain(page: Page, live_server_url,
                                                      django_user_model):
    staff = django_user_model.objects.create_user("root", is_staff=True)
    make_host("e2e-a", beat_s_ago=0)
    lost = make_host("e2e-b", beat_s_ago=120)
    log_in(page, live_server_url, staff)
    page.goto(f"{live_server_url}/hosts/")
    a, b = page.locator('tr[data-host="e2e-a"]'), page.locator('tr[data-host="e2e-b"]')
    expect(a).to_contain_text("4 cores, 8.0 GiB")
    expect(a).to_contain_text("0 / 8")
    expect(b.locator(".state")).to_have_text("lost")

    registry.beat(lost)  # its worker is back and says so
    announce("e2e-b")
    expect(b.locator(".state")).to_have_text("up")
    # a silent host ages on the page until it counts as lost (HOST_LOST_AFTER_S, 30 s)
    Host.objects.filter(name="e2e-a").update(beat_at=timezone.now() - timedelta(seconds=28))
    announce("e2e-a")
    expect(a.locator(".state")).to_have_text("lost", timeout=10_000)

    b.get_by_role("button", name="Drain").click()
    expect(b.locator(".state")).to_have_text("drained")
    assert Host.objects.get(name="e2e-b").drained
    b.get_by_role("button", name="Undrain").click()
    expect(b.locator(".state")).to_have_text("up")
    assert not Host.objects.get(name="e2e-b").drained


def test_another_users_job_shows_as_a_job_of_another_user(page: Page, live_server_url,
                                                          django_user_model):
    from jobs.models import Job, Reservation

    ada = django_user_model.objects.create_user("ada")
    bob = django_user_model.objects.create_user("bob")
    host = make_host("e2e-c", beat_s_ago=0)
    for owner, name, slot in ((ada, "adas-run", 0), (bob, "bobs-secret-run", 1)):
        job = Job.objects.create(name=name, owner=owner, spec={"name": name})
        Reservation.objects.create(job=job, host=host, incarnation=1, node_rank=0,
                                   slots=[slot])
    log_in(page, live_server_url, ada)
    page.goto(f"{live_server_url}/hosts/")
    row = page.locator('tr[data-host="e2e-c"]')
    expect(row).to_contain_text("adas-run")
    expect(row).to_contain_text("a job of another user")
    expect(row).not_to_contain_text("bobs-secret-run")
    expect(row.locator("a")).to_have_count(1)  # a link to ada's job only
