"""A person launches a 2x2 `nano` job from the form with an injected loss spike and a slow
rank, watches the dashboard explain both, and steers the run from its page: checkpoint,
rollback to a checkpoint picked on the loss chart, pause, resume, reshard onto another
strategy, rebalance the ranks' shares of the batch, cancel. Every control's result appears on
the page, and says done only once its effect shows (Checkpoint now is held until the checkpoint
is written; a resume waits for the engine to step again; the checkpoints a rollback abandoned
are labelled so in the picker; the shares chart follows a rebalance); screenshots of each stage
go to test-results/."""

import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from jobs.models import Command
from tests.e2e.session import ENGINE_START_MS
from tests.policies import paced

pytestmark = pytest.mark.django_db(transaction=True)

SPIKE_STEP, SLOW_RANK, SLOW_FROM = 12, 3, 14
# every rank's forward is stretched PACE times, asleep, from the first step (the job steps
# about as fast as `tiny` computes, and leaves the cores to the browser and the other tests);
# the slow rank's 4x more from SLOW_FROM on. The stretch follows the measured forward, which a
# busy machine slows too: 20 x 4 took 5 s and more a step on it
PACE = 5


def log_in(page: Page, url: str) -> None:
    page.goto(f"{url}/")
    page.fill("input[name=username]", "ada")
    page.fill("input[name=password]", "pw-ada-123")
    page.click("button:has-text('Log in')")
    expect(page.locator("h1")).to_have_text("Jobs")


def fill_launch_form(page: Page) -> None:
    form = page.locator("#launch")
    plan = page.locator("#launch-plan")
    form.locator("input[name=name]").fill("steer-e2e")
    form.locator("select[name='model.preset']").select_option("nano")
    form.locator("input[name='parallel.nodes']").fill("2")
    form.locator("input[name='parallel.procs_per_node']").fill("2")
    # the planner follows the layout: ten strategies for 2x2, one picked into the form
    expect(plan).to_have_attribute("data-state", "ready", timeout=30_000)
    expect(plan.locator("tr[data-strategy]")).to_have_count(10)
    plan.locator("tr[data-strategy=NNG]").click()
    expect(form.locator("select[name='parallel.strategy']")).to_have_value("NNG")
    fields = {"train.steps": "2000", "train.micro_batch": "2", "train.seq_len": "64",
              "train.warmup": "5", "train.eval_every": "0", "train.threads": "1",
              "checkpoint.every": "5", "checkpoint.keep": "10",
              "faults.policy.actions.straggler": "observe"}
    for name, value in fields.items():
        form.locator(f"[name='{name}']").fill(value)
    for fault in (*paced(4, PACE)["inject"],
                  {"kind": "loss_spike", "step": SPIKE_STEP, "rank": 1, "factor": 10},
                  {"kind": "slow_rank", "step": SLOW_FROM, "rank": SLOW_RANK,
                   "factor": 4 * PACE}):
        page.click("#add-fault")
        row = page.locator("#inject-rows .inject-row").last
        row.locator("[data-field=kind]").select_option(fault["kind"])
        for field in ("step", "rank", "factor"):
            row.locator(f"[data-field={field}]").fill(str(fault[field]))


def command_result(page: Page, kind: str):
    return page.locator(f"#results li[data-kind={kind}]").first


def record_checkpoint_button(page: Page) -> None:
    """window.enabledWhile: the newest checkpoint command's state each time the Checkpoint
    now button is enabled again."""
    page.evaluate("""() => {
        window.enabledWhile = [];
        const button = document.getElementById('checkpoint');
        new MutationObserver(() => button.disabled || window.enabledWhile.push(
            document.querySelector('#results li[data-kind=checkpoint]')?.dataset.state))
          .observe(button, { attributes: true, attributeFilter: ['disabled'] });
    }""")


def record_picker(page: Page) -> None:
    """window.picked: the rollback picker's [step, branch, labelled "abandoned branch"] rows,
    each time they change."""
    page.evaluate("""() => {
        window.picked = [];
        const list = document.getElementById('checkpoint-list');
        new MutationObserver(() => window.picked.push([...list.querySelectorAll('li[data-step]')]
            .map(li => [Number(li.dataset.step), li.dataset.branch,
                        li.textContent.includes('abandoned branch')])))
          .observe(list, { childList: true });
    }""")


def record_resume(page: Page) -> None:
    """window.resumes: the resume entry's state with the job's state and live step count, each
    time the Commands card changes."""
    page.evaluate("""() => {
        window.resumes = [];
        new MutationObserver(() => window.resumes.push({
            state: document.querySelector('#results li[data-kind=resume]')?.dataset.state,
            job: document.getElementById('state').dataset.state,
            steps: Number(document.getElementById('job').dataset.liveSteps) }))
          .observe(document.getElementById('results'), { childList: true, subtree: true,
                                                          attributes: true });
    }""")


def watch_the_spike_and_the_straggler(page: Page, output_dir: Path) -> None:
    """The loss chart fills live; the spike gets its anomaly marker on the curve."""
    expect(page.locator("#state")).to_have_text("running", timeout=ENGINE_START_MS)
    expect(page.locator("#job")).to_have_attribute("data-live-steps", re.compile(r"^\d\d+$"),
                                                   timeout=60_000)
    page.wait_for_function(
        """step => (document.getElementById('chart-loss').data || [])
             .some(t => t.name === 'anomalies' && t.x.includes(step))""",
        arg=SPIKE_STEP, timeout=60_000)
    # the marker sits on the curve at the spike's step; its hover names the anomaly and rank
    page.wait_for_function(
        """step => document.getElementById('chart-loss').data
             .find(t => t.name === 'loss').x.includes(step)""", arg=SPIKE_STEP)
    marker = page.evaluate("""step => {
        const t = document.getElementById('chart-loss').data.find(t => t.name === 'anomalies');
        const i = t.x.indexOf(step);
        return { y: t.y[i], text: t.text[i] };
    }""", SPIKE_STEP)
    assert marker["y"] > 0 and "loss_spike" in marker["text"] and "rank: 1" in marker["text"]
    expect(page.locator("#feed li[data-kind=loss_spike]")).to_have_count(1)

    # the slow rank is the straggler row of the rank x op heatmap
    expect(page.locator("#chart-ranks")).to_have_attribute("data-straggler", str(SLOW_RANK),
                                                           timeout=60_000)
    expect(page.locator("#chart-ranks")).to_contain_text(f"rank {SLOW_RANK} ⚠ straggler")
    page.screenshot(path=output_dir / "2-spike-and-straggler.png", full_page=True)
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.screenshot(path=output_dir / "2-wide-screen.png", full_page=True)
    page.set_viewport_size({"width": 1366, "height": 900})


def checkpoint_now(page: Page) -> None:
    """The button is held from the click until the engine acknowledges the checkpoint it
    wrote, then given back."""
    record_checkpoint_button(page)
    page.click("#checkpoint")
    expect(page.locator("#checkpoint")).to_be_disabled()
    expect(command_result(page, "checkpoint")).to_have_attribute("data-state", "done",
                                                                timeout=60_000)
    expect(command_result(page, "checkpoint")).to_contain_text(re.compile(r"step-\d+"))
    expect(page.locator("#checkpoint")).to_be_enabled()
    assert set(page.evaluate("window.enabledWhile")) == {"done"}


def roll_back_to_a_checkpoint_picked_on_the_chart(page: Page, output_dir: Path) -> int:
    """Roll back to a checkpoint picked on the loss chart (its diamond marker), skipping data;
    the step rolled back to."""
    page.click("#rollback")
    target = page.evaluate("""() => {
        const gd = document.getElementById('chart-loss');
        const trace = gd.data.find(t => t.name === 'checkpoints');
        // the third newest step: kept (keep=10), and far enough back that the new branch
        // takes ten steps or more to save again every step past it (a step saved again is
        // listed once, on the live branch), so the abandoned ones are listed for a while
        const steps = [...new Set(trace.x)].sort((a, b) => a - b);
        const i = trace.x.indexOf(steps[Math.max(0, steps.length - 3)]);
        const { xaxis, yaxis, _size } = gd._fullLayout;
        const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
        return { step: trace.x[i], x: box.left + xaxis.l2p(trace.x[i]),
                 y: box.top + yaxis.l2p(trace.y[i]) };
    }""")
    page.mouse.click(target["x"], target["y"])
    expect(page.locator("#rollback-picked")).to_have_text(f"checkpoint of step {target['step']}")
    page.check("#rollback-skip")
    record_picker(page)
    page.click("#rollback-go")
    rollback = command_result(page, "rollback")
    expect(rollback).to_have_attribute("data-state", "done", timeout=60_000)
    expect(rollback).to_contain_text(f"→ {target['step']}")
    expect(rollback).to_contain_text("data window skipped")
    # the checkpoints written past the target before the rollback stay in the picker as the
    # abandoned branch, after the live one; a step the new branch saved again is listed once
    page.wait_for_function("() => window.picked.some(rows => rows.some(r => r[1] === 'abandoned'))",
                           timeout=30_000)
    for rows in page.evaluate("window.picked"):
        branches = [branch for _, branch, _ in rows]
        assert branches == sorted(branches, key=lambda b: b == "abandoned"), rows
        assert all(labelled == (branch == "abandoned") for _, branch, labelled in rows), rows
        assert all(step > target["step"] for step, b, _ in rows if b == "abandoned"), rows
        assert len({step for step, _, _ in rows}) == len(rows), rows
    page.wait_for_function(
        """() => document.getElementById('chart-loss').data
             .some(t => t.name === 'actions' && t.text.some(s => s.includes('rollback')))""")
    page.screenshot(path=output_dir / "3-rolled-back.png", full_page=True)
    return target["step"]


def resume_and_see_the_engine_run_again(page: Page, output_dir: Path) -> None:
    """The API settles a resume at once (the job is queued again), but the page says done
    only when the engine comes back from the pause checkpoint: running, and a step from it."""
    record_resume(page)
    steps_before = int(page.locator("#job").get_attribute("data-live-steps"))
    page.click("#resume")
    resume = command_result(page, "resume")
    expect(resume).to_have_attribute("data-state", "waiting")
    expect(resume).to_contain_text("waiting for the engine")
    expect(resume).to_have_attribute("data-state", "done", timeout=ENGINE_START_MS)
    done = next(r for r in page.evaluate("window.resumes") if r["state"] == "done")
    assert done["job"] == "running" and done["steps"] > steps_before, done
    expect(page.locator("#state")).to_have_text("running")
    page.screenshot(path=output_dir / "5-resumed.png", full_page=True)


def wait_for_shares(page: Page, shares: list[int]) -> None:
    """The shares chart has a line per rank, each ending at that rank's samples in `shares`."""
    page.wait_for_function(
        """shares => {
            const traces = document.getElementById('chart-shares').data || [];
            return traces.length === shares.length
              && traces.every((t, r) => t.name === `rank ${r}` && t.y.at(-1) === shares[r]);
        }""", arg=shares, timeout=30_000)


def rebalance_from_the_panel(page: Page, output_dir: Path) -> None:
    """The panel starts from the even shares the chart draws; a list that does not sum to the
    global batch is refused by the API, naming the shares, and nothing is sent to the engine;
    a pinned list, the slow rank the least, is done and the chart's lines end at it."""
    spec = json.loads(page.locator("#job-spec").text_content())
    train, parallel = spec["train"], spec["parallel"]
    ranks = parallel["nodes"] * parallel["procs_per_node"]
    batch, least = train["micro_batch"] * ranks * train["grad_accum"], train["grad_accum"]
    wait_for_shares(page, [batch // ranks] * ranks)
    pinned = [(batch - least) // (ranks - 1)] * (ranks - 1) + [least]
    pinned[0] += batch - sum(pinned)
    assert SLOW_RANK == ranks - 1 and sum(pinned) == batch and pinned[-1] < min(pinned[:-1])

    page.click("#rebalance")
    field = page.locator("#rebalance-shares")
    expect(field).to_have_value(", ".join([str(batch // ranks)] * ranks))
    field.fill(", ".join(str(n) for n in [*pinned[:-1], least + 1]))
    with page.expect_response(lambda r: r.url.endswith("/rebalance/")) as answer:
        page.click("#rebalance-go")
    assert answer.value.status == 400, answer.value.text()
    refused = command_result(page, "rebalance")
    expect(refused).to_have_attribute("data-state", "refused")
    expect(refused).to_contain_text(
        f"Rebalance refused: shares: must sum to the global batch of {batch} samples")
    assert not Command.objects.filter(kind="rebalance").exists()

    field.fill(", ".join(str(n) for n in pinned))
    page.click("#rebalance-go")
    done = command_result(page, "rebalance")
    expect(done).to_have_attribute("data-state", "done", timeout=60_000)
    expect(done).to_contain_text(
        re.compile(rf"Rebalance done at step \d+: shares {', '.join(str(n) for n in pinned)}$"))
    wait_for_shares(page, pinned)
    page.screenshot(path=output_dir / "7-rebalanced.png", full_page=True)


def test_launch_a_faulty_2x2_job_watch_the_dashboard_explain_it_and_steer_it(
        page, live_server_url, celery_worker, user, output_dir):
    log_in(page, live_server_url)
    page.click("text=New job")
    fill_launch_form(page)
    with page.expect_response(lambda r: r.url.endswith("/api/jobs/")) as created:
        page.locator("#launch button[type=submit]").click()
    assert created.value.status == 201, created.value.text()
    expect(page).to_have_url(re.compile(r"/jobs/\d+/$"), timeout=30_000)
    page.screenshot(path=output_dir / "1-job-page.png", full_page=True)

    watch_the_spike_and_the_straggler(page, output_dir)

    checkpoint_now(page)

    target = roll_back_to_a_checkpoint_picked_on_the_chart(page, output_dir)

    # pause: checkpoint and stop
    expect(page.locator("#pause")).to_be_enabled(timeout=ENGINE_START_MS)
    page.click("#pause")
    expect(command_result(page, "pause")).to_have_attribute("data-state", "done", timeout=60_000)
    expect(page.locator("#state")).to_have_text("paused", timeout=60_000)
    page.screenshot(path=output_dir / "4-paused.png", full_page=True)
    history = page.locator("#history")
    expect(history).to_contain_text("paused")
    # the steps trained again after the rollback replaced the old ones: the curve never
    # runs backwards
    steps = page.evaluate("""() => document.getElementById('chart-loss').data
        .find(t => t.name === 'loss').x""")
    assert steps == sorted(set(steps)) and steps[-1] > target

    resume_and_see_the_engine_run_again(page, output_dir)

    # reshard onto another strategy on the same 2x2 layout, picked in the planner's table
    page.click("#reshard")
    plan = page.locator("#reshard-plan")
    expect(plan).to_have_attribute("data-state", "ready", timeout=30_000)
    plan.locator("tr[data-strategy=NIG]").click()
    expect(page.locator("#reshard-picked")).to_contain_text("NIG:")
    page.click("#reshard-go")
    reshard = command_result(page, "reshard")
    expect(reshard).to_have_attribute("data-state", "done", timeout=ENGINE_START_MS)
    expect(reshard).to_contain_text("NIG")
    expect(page.locator("#state")).to_have_text("running", timeout=ENGINE_START_MS)
    page.screenshot(path=output_dir / "6-resharded.png", full_page=True)

    rebalance_from_the_panel(page, output_dir)

    # cancel: the ranks stop and the page says so
    page.click("#cancel")
    expect(page.locator("#state")).to_have_text("cancelled", timeout=60_000)
    expect(history).to_contain_text("cancelled")
    page.screenshot(path=output_dir / "8-cancelled.png", full_page=True)
