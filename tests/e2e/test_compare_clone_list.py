"""The compare page overlays the loss of two runs; Clone opens the launch form filled with the
job's spec and launches a new job from it; the job list follows state changes live."""

import re

import pytest
from playwright.sync_api import Page, expect

from engine.runtime.spec import parse_spec
from jobs.models import Cause, Job
from monitor.models import MetricPoint
from tests.e2e.session import log_in, off_the_page_thread
from tests.platform.services import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 300


def finished_job(user, name: str, strategy: str, loss_scale: float) -> Job:
    """A completed 2-rank job whose loss and throughput are stored for every step."""
    spec = parse_spec({"name": name, "model": {"preset": "tiny"},
                       "parallel": {"nodes": 1, "procs_per_node": 2, "strategy": strategy},
                       "train": {"steps": STEPS}}).to_dict()
    job = Job.objects.create(name=name, owner=user, spec=spec, state="completed", step=STEPS)
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, name=name, step=step, value=value)
        for step in range(1, STEPS + 1)
        for name, value in {"loss": loss_scale * 6.0 / step ** 0.5,
                            "tokens_per_s": 1000.0 * loss_scale}.items())
    return job


def loss_of(job: Job) -> list[float]:
    return list(MetricPoint.objects.filter(job=job, name="loss").order_by("step")
                .values_list("value", flat=True))


def test_the_compare_page_overlays_the_loss_of_the_runs_picked_and_keeps_them_in_its_link(
        page: Page, live_server_url, user, output_dir):
    older = finished_job(user, "paro-nng", "NNG", 1.0)
    runs = [finished_job(user, "paro-ggg", "GGG", 1.3), older]  # as listed: newest first
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/compare/")
    form = page.locator("#compare")
    for job in runs:
        form.locator(f"input[value='{job.pk}']").check()
    picked = ",".join(str(job.pk) for job in runs)
    expect(form).to_have_attribute("data-drawn", picked)

    def overlay() -> list[dict]:
        return page.evaluate("document.getElementById('compare-loss').data"
                             ".map(t => ({name: t.name, y: t.y}))")

    drawn = overlay()
    assert [t["name"] for t in drawn] == [
        f"#{job.pk} {job.name} ({job.spec['parallel']['strategy']} on 1×2)" for job in runs]
    assert [t["y"] for t in drawn] == [pytest.approx(loss_of(job)) for job in runs]
    page.screenshot(path=output_dir / "compare.png", full_page=True)

    # the choice is in the address: the link opens the same comparison
    expect(page).to_have_url(re.compile(rf"\?jobs={picked.replace(',', '%2C')}$"))
    page.reload()
    expect(form).to_have_attribute("data-drawn", picked)
    assert [t["name"] for t in overlay()] == [t["name"] for t in drawn]


def test_clone_opens_the_launch_form_filled_with_the_jobs_spec_and_launches_a_new_job(
        page: Page, live_server_url, user, output_dir):
    spec = parse_spec({
        "name": "original", "model": {"preset": "tiny", "num_hidden_layers": 4},
        "parallel": {"nodes": 1, "procs_per_node": 2, "strategy": "NIG", "collective": "ring"},
        "train": {"steps": 37, "lr": 7e-4, "micro_batch": 2, "seq_len": 64, "threads": 1},
        "checkpoint": {"every": 10, "keep": 2},
        "faults": {"policy": {"actions": {"loss_spike": ["skip_update", "rollback"]}},
                   "inject": [{"kind": "loss_spike", "step": 12, "rank": 1, "factor": 8.0}]},
    }).to_dict()
    original = Job.objects.create(name="original", owner=user, spec=spec, state="completed")
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/jobs/{original.pk}/")
    page.click("#clone")

    expect(page).to_have_url(f"{live_server_url}/jobs/new/?clone={original.pk}")
    form = page.locator("#launch")
    expected = {"name": "original-2", "model.preset": "tiny", "model": '{"num_hidden_layers":4}',
                "parallel.procs_per_node": "2", "parallel.strategy": "NIG",
                "parallel.collective": "ring", "train.steps": "37", "train.lr": "0.0007",
                "checkpoint.every": "10", "faults.policy.actions.loss_spike":
                "skip_update, rollback", "faults.inject.0.kind": "loss_spike",
                "faults.inject.0.rank": "1", "faults.inject.0.factor": "8"}
    for name, value in expected.items():
        expect(form.locator(f"[name='{name}']")).to_have_value(value)
    page.screenshot(path=output_dir / "clone-form.png", full_page=True)

    form.locator("input[name=name]").fill("the-clone")
    form.locator("button[type=submit]").click()
    expect(page).to_have_url(re.compile(r"/jobs/\d+/$"))
    clone = Job.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
    # everything the form carried comes back as it was, but the name
    assert clone.pk != original.pk and clone.owner == user
    assert clone.spec == {**original.spec, "name": "the-clone"}
    # no worker here: cancel the queued clone so that no later test's worker trains it
    expect(page.locator("#live")).to_have_text("live")
    page.click("#cancel")
    expect(page.locator("#state")).to_have_text("cancelled")


def test_the_job_list_shows_state_changes_and_new_jobs_without_a_reload(
        page: Page, live_server_url, user, output_dir):
    listed = Job.objects.create(name="listed", owner=user, spec=SMALL_SPEC)
    log_in(page, live_server_url, user)
    frames: list[str] = []
    page.on("websocket",
            lambda socket: socket.on("framereceived", lambda data: frames.append(data)))
    page.goto(f"{live_server_url}/")
    row = page.locator(f"tr[data-job-id='{listed.pk}']")
    expect(row.locator(".state")).to_have_text("Queued")
    page.evaluate("window.loadedOnce = true")  # gone if the page were reloaded
    while not frames:  # the socket's snapshot: from here on it hears every change
        page.wait_for_timeout(50)

    def supervisor_starts_it() -> None:
        listed.start(supervisor="test")
        listed.transition("running", Cause.WORKER)
    off_the_page_thread(supervisor_starts_it)
    expect(row.locator(".state")).to_have_text("Running")

    # a job launched elsewhere (another tab, a script) gets a row at its first state change
    elsewhere = Job.objects.create(name="elsewhere", owner=user, spec=SMALL_SPEC)
    off_the_page_thread(lambda: elsewhere.transition("cancelled", Cause.API_TOKEN))
    expect(page.locator(f"tr[data-job-id='{elsewhere.pk}'] .state")).to_have_text("Cancelled")
    assert page.evaluate("window.loadedOnce") is True
    page.screenshot(path=output_dir / "list.png", full_page=True)
