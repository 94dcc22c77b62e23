"""The pages people keep open between runs: the job list (search, filters, tags and notes
edited in place, sorting, picking runs to compare), the compare page (any stored series, the
specs side by side with what differs marked) and the job page's chart options (smoothing,
log scale, x-axis), which the browser remembers. Finished jobs with stored metrics; no
worker."""

import re

import pytest
from playwright.sync_api import Page, expect

from engine.runtime.spec import parse_spec
from jobs.models import Job
from monitor.models import MetricPoint
from tests.e2e.session import log_in

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 40
TOKENS_PER_STEP = 512


def finished_job(user, name: str, strategy: str, lr: float, tags: list[str]) -> Job:
    spec = parse_spec({"name": name, "model": {"preset": "tiny"},
                       "parallel": {"nodes": 1, "procs_per_node": 2, "strategy": strategy},
                       "train": {"steps": STEPS, "lr": lr}}).to_dict()
    job = Job.objects.create(name=name, owner=user, spec=spec, state="completed", step=STEPS,
                             tags=tags)
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, name=metric, step=step, value=value)
        for step in range(1, STEPS + 1)
        for metric, value in {"loss": 6.0 / step ** 0.5 + (0.3 if step % 2 else 0.0),
                              "tokens_per_s": 900.0 + step, "lr": lr,
                              "tokens": TOKENS_PER_STEP, "step_time": 0.5}.items())
    return job


@pytest.fixture
def runs(user) -> list[Job]:
    return [finished_job(user, "baseline", "NNG", 2e-3, ["paro"]),
            finished_job(user, "ablation-ggg", "GGG", 1e-3, ["paro", "ablation"]),
            finished_job(user, "other", "NNN", 2e-3, [])]


def listed(page: Page) -> list[str]:
    return page.locator("#job-rows td.name a").all_inner_texts()


def test_the_job_list_searches_filters_edits_tags_and_notes_and_picks_runs_to_compare(
        page: Page, live_server_url, user, runs, output_dir):
    baseline, ablation, other = runs
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/")
    expect(page.locator("#job-rows tr")).to_have_count(3)
    row = page.locator(f"tr[data-job-id='{baseline.pk}']")
    expect(row.locator(".step")).to_have_text(f"{STEPS} / {STEPS}")
    expect(row.locator(".loss")).to_have_text(re.compile(r"^0\.9"))  # 6/sqrt(40)
    expect(row.locator(".tokens")).to_have_text("940")

    page.fill("#job-filters input[name=name]", "abl")
    expect(page.locator("#job-rows tr")).to_have_count(1)
    assert listed(page) == ["ablation-ggg"]
    expect(page).to_have_url(re.compile(r"\?name=abl$"))
    page.fill("#job-filters input[name=name]", "")
    page.select_option("#job-filters select[name=state]", "completed")
    expect(page.locator("#job-rows tr")).to_have_count(3)
    page.select_option("#job-filters select[name=state]", "running")
    expect(page.locator("#no-jobs")).to_be_visible()
    page.select_option("#job-filters select[name=state]", "")

    # a tag's chip filters by it
    page.locator(f"tr[data-job-id='{ablation.pk}'] .chip", has_text="paro").click()
    expect(page.locator("#job-filters input[name=tag]")).to_have_value("paro")
    expect(page.locator("#job-rows tr")).to_have_count(2)
    page.fill("#job-filters input[name=tag]", "")

    # tags and a note, edited in place and saved through the API
    page.locator(f"tr[data-job-id='{other.pk}'] .edit").click()
    page.fill(f"tr[data-job-id='{other.pk}'] input[name=tags]", "Bad Tag")
    page.locator(f"tr[data-job-id='{other.pk}'] button", has_text="Save").click()
    expect(page.locator(f"tr[data-job-id='{other.pk}'] .error")).to_contain_text("not a tag")
    page.fill(f"tr[data-job-id='{other.pk}'] input[name=tags]", "dense, baseline")
    page.fill(f"tr[data-job-id='{other.pk}'] textarea[name=note]", "NNN: no sharding at all")
    page.locator(f"tr[data-job-id='{other.pk}'] button", has_text="Save").click()
    expect(page.locator(f"tr[data-job-id='{other.pk}'] .note")).to_have_text(
        "NNN: no sharding at all")
    other.refresh_from_db()
    assert (other.tags, other.note) == (["dense", "baseline"], "NNN: no sharding at all")

    # sorted by name, both ways
    page.click("th[data-sort=name]")
    expect(page.locator("#job-rows td.name a").first).to_have_text("ablation-ggg")
    page.click("th[data-sort=name]")
    expect(page.locator("#job-rows td.name a").first).to_have_text("other")
    page.screenshot(path=output_dir / "list.png", full_page=True)

    # two runs picked: Compare opens them side by side
    for job in (baseline, ablation):
        page.check(f"tr[data-job-id='{job.pk}'] input[type=checkbox]")
    page.click("#compare-picked")
    expect(page).to_have_url(re.compile(rf"/compare/\?jobs=({baseline.pk}%2C{ablation.pk}"
                                        rf"|{baseline.pk},{ablation.pk})"))
    # drawn as the compare page lists runs: newest first
    expect(page.locator("#compare")).to_have_attribute("data-drawn",
                                                       f"{ablation.pk},{baseline.pk}")


def test_the_compare_page_overlays_a_picked_series_and_marks_the_spec_fields_that_differ(
        page: Page, live_server_url, user, runs, output_dir):
    baseline, ablation, _ = runs
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/compare/?jobs={baseline.pk},{ablation.pk}")
    form = page.locator("#compare")
    expect(form).to_have_attribute("data-drawn", f"{ablation.pk},{baseline.pk}")
    picker = page.locator("#series-picker")
    assert set(picker.locator("input").evaluate_all("els => els.map(e => e.value)")) == {
        "loss", "tokens_per_s", "lr", "tokens", "step_time"}

    picker.locator("input[value=lr]").check()
    page.wait_for_function("() => document.getElementById('compare-lr')?.data?.length === 2")
    lr = page.evaluate("document.getElementById('compare-lr').data.map(t => t.y[0])")
    assert lr == [pytest.approx(1e-3), pytest.approx(2e-3)]
    expect(page).to_have_url(re.compile(r"series=loss%2Ctokens_per_s%2Clr"))

    differing = page.locator("#spec-diff tr.differs td:first-child").all_inner_texts()
    assert {"name", "parallel.strategy", "train.lr"} <= set(differing)
    assert "model.preset" not in differing
    assert "train.steps" not in page.locator("#spec-diff").inner_text()  # same in both
    page.check("#diff-all")
    expect(page.locator("#spec-diff tr[data-field='train.steps']")).to_have_count(1)
    page.screenshot(path=output_dir / "compare.png", full_page=True)


def ema(values: list[float], weight: float) -> list[float]:
    average, out = 0.0, []
    for n, value in enumerate(values, start=1):
        average = average * weight + (1 - weight) * value
        out.append(average / (1 - weight ** n))
    return out


def loss_traces(page: Page) -> dict[str, dict]:
    return page.evaluate("""() => Object.fromEntries(document.getElementById('chart-loss').data
        .map(t => [t.name, {x: Array.from(t.x), y: Array.from(t.y), opacity: t.opacity}]))""")


def test_smoothing_log_scale_and_the_x_axis_switch_and_are_remembered(
        page: Page, live_server_url, user, runs, output_dir):
    baseline = runs[0]
    log_in(page, live_server_url, user)
    page.goto(f"{live_server_url}/jobs/{baseline.pk}/")
    page.wait_for_function("() => document.getElementById('chart-loss').data?.some("
                           "t => t.name === 'loss' && t.x.length > 0)")
    raw = loss_traces(page)["loss"]
    assert raw["x"] == list(range(1, STEPS + 1))

    page.locator("#opt-smoothing").fill("0.9")
    traces = loss_traces(page)
    smoothed = traces["loss (smoothed)"]["y"]
    assert traces["loss"]["opacity"] == 0.25 and traces["loss"]["y"] == raw["y"]
    # an exponential moving average, debiased as TensorBoard's (the first point is its own)
    assert smoothed == pytest.approx(ema(raw["y"], 0.9))
    assert smoothed[0] == pytest.approx(raw["y"][0])

    page.check("#opt-log")
    assert page.evaluate("document.getElementById('chart-loss').layout.yaxis.type") == "log"
    page.select_option("#opt-x", "tokens")
    assert loss_traces(page)["loss"]["x"] == [s * TOKENS_PER_STEP for s in range(1, STEPS + 1)]
    assert page.evaluate("document.getElementById('chart-lr').layout.xaxis.title.text") == (
        "tokens seen")
    page.select_option("#opt-x", "time")
    assert loss_traces(page)["loss"]["x"] == [pytest.approx(0.5 * s) for s in range(1, STEPS + 1)]
    page.screenshot(path=output_dir / "options.png", full_page=True)

    page.reload()  # the choice is kept
    page.wait_for_function("() => document.getElementById('chart-loss').data?.some("
                           "t => t.name === 'loss (smoothed)')")
    expect(page.locator("#opt-x")).to_have_value("time")
    expect(page.locator("#opt-log")).to_be_checked()
    assert page.evaluate("document.getElementById('chart-loss').layout.yaxis.type") == "log"
