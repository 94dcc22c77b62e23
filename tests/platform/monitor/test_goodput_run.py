"""The goodput ledger of a real run: a nano job on two ranks through the worker, with a rank
that crashes (restarted by the engine), a loss spike the policy rolls back, a warm pause and
resume through the API, and a slow rank. The ledger served by the API agrees, cause by cause,
with seconds this test reads off the stored event timestamps itself, and its causes add up to
the wall-clock time."""

import statistics
import time

import pytest

from jobs.models import Job, State
from monitor.models import Event

pytestmark = pytest.mark.django_db(transaction=True)

TOLERANCE = 0.05  # goodput_accounting_error


def spec(small_spec: dict) -> dict:
    small_spec["name"] = "goodput"
    small_spec["parallel"] = {"nodes": 1, "procs_per_node": 2}
    small_spec["train"].update(steps=60, eval_every=20)
    small_spec["checkpoint"] = {"every": 3}
    small_spec["faults"] = {
        "inject": [{"kind": "slow_rank", "step": 2, "rank": 1, "factor": 3.0},
                   {"kind": "crash", "step": 5, "rank": 1},
                   {"kind": "loss_spike", "step": 11, "rank": 0, "factor": 30.0}],
        "policy": {"actions": {"straggler": ["observe"], "loss_spike": ["rollback"]}},
    }
    return small_spec


def run_with_a_pause(api, small_spec: dict, eventually, worker) -> Job:
    """Launch, pause warm once it is past the spike, resume two seconds later, wait for the end."""
    job_id = api.post("/api/jobs/", spec(small_spec), format="json").json()["id"]
    eventually(lambda: Job.objects.get(pk=job_id).step >= 14, 90,
               f"job {job_id} did not get past the spike; worker log: {worker.log_path}")
    assert api.post(f"/api/jobs/{job_id}/pause/", {"mode": "warm"},
                    format="json").status_code == 202
    eventually(lambda: Job.objects.get(pk=job_id).state == State.PAUSED_WARM, 30,
               "the job did not pause")
    time.sleep(2)
    assert api.post(f"/api/jobs/{job_id}/resume/", {}, format="json").status_code == 202
    eventually(lambda: Job.objects.get(pk=job_id).state == State.COMPLETED, 60,
               f"the job did not complete; worker log: {worker.log_path}")
    return Job.objects.get(pk=job_id)


def wait_s(ops: dict) -> float:
    compute = sorted(r["compute_ms"] for r in ops["ranks"])
    return (compute[-1] - statistics.median(compute[:-1])) / 1000


def data_wait_s(ops: dict) -> float:
    """The step's wait on its data (on a busy machine the loader can fall behind)."""
    return ops["data_wait_share"] * ops["step_ms"] / 1000


def expected_seconds(job: Job) -> dict[str, float]:
    """Each cause's seconds, read off the stored timestamps: the windows between the events
    that open and close each loss, the checkpoints' blocking time, the waits for the slow rank
    and for data, and the evaluations; productive is the rest of the wall-clock time."""
    events = list(Event.objects.filter(job=job).order_by("seq").values_list("data", flat=True))
    moves = {t.to_state: t.time.timestamp() for t in job.transitions.all()}  # the last of each
    first_start = job.transitions.filter(to_state="starting").first().time.timestamp()
    wall = job.finished_at.timestamp() - job.created_at.timestamp()

    def boundary_before(i: int) -> float:
        """The time of the last step, checkpoint, rollback or `running` event before
        events[i]: where the window that events[i] closes opened."""
        return next(e["time"] for e in reversed(events[:i]) if e["type"] in ("step",
                    "checkpoint") or (e["type"], e.get("state")) == ("state", "running")
                    or (e["type"], e.get("action")) == ("action", "rollback"))

    def index(match) -> int:
        return next(i for i, e in enumerate(events) if match(e))

    runs = [e["time"] for e in events if (e["type"], e.get("state")) == ("state", "running")]
    crash = index(lambda e: e["type"] == "anomaly" and e["kind"] == "crash")
    rollback = index(lambda e: e["type"] == "action" and e["action"] == "rollback")
    pause = index(lambda e: e["type"] == "action" and e["action"] == "pause")
    final_checkpoint = [e for e in events if e["type"] == "checkpoint"][-1]
    seconds = {
        "queue": first_start - job.created_at.timestamp(),
        "startup": (runs[0] - first_start) + (moves["completed"] - final_checkpoint["time"]),
        "recovery": runs[1] - boundary_before(crash),
        "skipped": events[rollback]["time"] - boundary_before(rollback),
        "pause": runs[2] - boundary_before(pause),
        "checkpoint": sum(e["blocking_s"] for e in events if e["type"] == "checkpoint"),
        "straggler": sum(wait_s(e) for e in events if e["type"] == "ops"),
        "data": sum(data_wait_s(e) for e in events if e["type"] == "ops"),
        "eval": 0.0, "retrained": 0.0,
    }
    highest = 0
    for i, e in enumerate(events):
        if e["type"] != "step":
            continue
        interval = e["time"] - boundary_before(i)
        if e.get("eval_loss") is not None:
            # never below nothing: `step_time` is the slowest rank's, which may have started
            # its step before rank 0 published the boundary (a busy machine)
            evaluation = max(0.0, interval - e["step_time"])
            seconds["eval"] += evaluation
            interval -= evaluation
        if e["step"] <= highest:
            ops = next(o for o in events[i:] if o["type"] == "ops")
            seconds["retrained"] += interval - wait_s(ops) - data_wait_s(ops)
        highest = max(highest, e["step"])
    seconds["productive"] = wall - sum(seconds.values())
    return seconds


def test_a_faulty_runs_ledger_agrees_with_its_event_timestamps(api, celery_worker, small_spec,
                                                                eventually):
    job = run_with_a_pause(api, small_spec, eventually, celery_worker)
    ledger = api.get(f"/api/jobs/{job.pk}/goodput/").json()
    got = {cause: entry["seconds"] for cause, entry in ledger["causes"].items()}
    wall = job.finished_at.timestamp() - job.created_at.timestamp()
    assert ledger["closed"] and ledger["wall_s"] == pytest.approx(wall, abs=1e-3)
    assert sum(got.values()) == pytest.approx(ledger["wall_s"], abs=1e-6)  # productive + losses

    expected = expected_seconds(job)
    for cause in ("queue", "startup", "recovery", "retrained", "skipped", "straggler", "pause",
                  "checkpoint", "eval", "productive"):
        assert expected[cause] > 0, f"the run has no {cause} time to account for"
    error = {cause: abs(got[cause] - expected[cause]) / max(expected[cause], 0.01 * wall)
             for cause in expected}
    print(f"goodput_accounting_error={max(error.values()):.4f} wall={wall:.1f}s "
          + " ".join(f"{c}={got[c]:.2f}/{expected[c]:.2f}" for c in expected))
    assert max(error.values()) <= TOLERANCE, (error, got, expected)
