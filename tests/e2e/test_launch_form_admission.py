"""The launch form turns Launch off, saying why, while the planner says no registered host
holds the model in any strategy (jobs.admission), and on again for a model that fits."""

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from hosts.models import Host
from tests.e2e.session import log_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_launch_is_off_while_no_host_holds_the_model(page: Page, live_server_url, user,
                                                      session_worker_host_drained):
    # the session worker's host stays registered (its beat would put a deleted row back, and a
    # drained host still counts): the refused model is one no machine running this holds
    Host.objects.create(name="e2e-small", address="10.0.0.9", slots=8, instance="x",
                        beat_at=timezone.now(),
                        devices={"cpu": {"cores": 4, "memory_bytes": 10**9}, "gpus": []})
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/jobs/new/")
    form, plan = page.locator("#launch"), page.locator("#launch-plan")
    launch, why = form.locator("button[type=submit]"), page.locator("#launch-refused")
    # 34B parameters in the embedding and head alone: over 500 GB of fp32 state on one rank
    form.locator("textarea[name='model']").fill('{"vocab_size": 1048576, "hidden_size": 16384}')
    expect(launch).to_be_disabled(timeout=30_000)
    expect(why).to_be_visible()
    expect(why).to_contain_text("the largest device of a registered host holds")
    form.locator("textarea[name='model']").fill("")
    form.locator("select[name='model.preset']").select_option("nano")
    expect(plan).to_have_attribute("data-state", "ready", timeout=30_000)
    expect(launch).to_be_enabled()
    expect(why).to_be_hidden()
