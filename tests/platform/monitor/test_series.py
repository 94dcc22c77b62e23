"""Downsampling that keeps extremes: spikes survive, point counts stay bounded, a zoomed window
is exact at full resolution; the REST reads of metrics, op timings and expert load."""

import pytest

from jobs.models import Job
from monitor.ingest import store_events
from monitor.models import MetricPoint
from monitor.series import (
    expert_history,
    experts_recent,
    metric_series,
    ops_history,
    ops_recent,
)

pytestmark = pytest.mark.django_db

STEPS = 20_000
SPIKE_STEP = 12_345


@pytest.fixture
def long_run(job):
    """A flat loss of 1.0 over 20,000 steps with a one-step spike to 50 and one NaN step."""
    MetricPoint.objects.bulk_create(
        [MetricPoint(job=job, name="loss", step=s,
                     value=50.0 if s == SPIKE_STEP else None if s == 7_000 else 1.0)
         for s in range(1, STEPS + 1)]
        + [MetricPoint(job=job, name="lr", step=s, value=s * 1e-6) for s in range(1, STEPS + 1)],
        batch_size=5000)
    return job


def test_a_one_step_spike_survives_downsampling_in_the_envelope(long_run):
    loss = metric_series(long_run.pk, ["loss"], max_points=200)["loss"]
    assert 100 < len(loss["step"]) <= 200
    assert max(loss["max"]) == 50.0
    spike = loss["max"].index(50.0)
    assert loss["step"][spike] <= SPIKE_STEP < loss["step"][spike + 1]
    assert loss["min"][spike] == 1.0  # the envelope spans the spike's bucket
    assert all(m == 1.0 for i, m in enumerate(loss["max"]) if i != spike)


def test_a_bucket_holding_a_nan_step_reads_null_but_keeps_its_envelope(long_run):
    loss = metric_series(long_run.pk, ["loss"], max_points=200)["loss"]
    nan = [i for i, v in enumerate(loss["value"]) if v is None]
    assert len(nan) == 1 and loss["step"][nan[0]] <= 7_000 < loss["step"][nan[0] + 1]
    assert loss["min"][nan[0]] == loss["max"][nan[0]] == 1.0


def test_every_series_shares_one_bucket_grid_and_the_point_budget(long_run):
    series = metric_series(long_run.pk, max_points=500)
    assert set(series) == {"loss", "lr"}
    assert series["loss"]["step"] == series["lr"]["step"]
    assert len(series["lr"]["step"]) <= 500
    # the envelope of a rising line: each bucket's min and max are its first and last steps
    lr = series["lr"]
    width = lr["step"][1] - lr["step"][0]
    assert lr["min"][3] == pytest.approx(lr["step"][3] * 1e-6)
    assert lr["max"][3] == pytest.approx((lr["step"][3] + width - 1) * 1e-6)


def test_a_zoomed_window_with_few_steps_is_exact(long_run):
    window = metric_series(long_run.pk, ["loss"], start=SPIKE_STEP - 50, end=SPIKE_STEP + 50,
                           max_points=200)["loss"]
    assert window["step"] == list(range(SPIKE_STEP - 50, SPIKE_STEP + 51))
    expected = [50.0 if s == SPIKE_STEP else 1.0 for s in window["step"]]
    assert window["value"] == window["min"] == window["max"] == expected


def test_the_metrics_endpoint_downsamples_the_requested_window(api, long_run):
    body = api.get(f"/api/jobs/{long_run.pk}/metrics/",
                   {"names": "loss", "from": 10_000, "to": 15_000, "max_points": 100}).json()
    loss = body["series"]["loss"]
    assert set(body["series"]) == {"loss"}
    assert len(loss["step"]) <= 100 and loss["step"][0] == 10_000 and loss["step"][-1] <= 15_000
    assert max(loss["max"]) == 50.0


@pytest.mark.parametrize("params, field", [
    ({"max_points": 1}, "max_points"), ({"max_points": "many"}, "max_points"),
    ({"from": 10, "to": 5}, "to"), ({"from": -1}, "from"),
])
def test_bad_metrics_parameters_are_refused_naming_the_field(api, job, params, field):
    response = api.get(f"/api/jobs/{job.pk}/metrics/", params)
    assert response.status_code == 400
    assert field in response.json()


def ops_event(seq: int, step: int, step_ms: float, slow_rank: int) -> dict:
    per_rank = [5.0, 5.0]
    per_rank[slow_rank] = step_ms - 2
    return {"type": "ops", "job": "1", "step": step, "time": 1.0, "seq": seq,
            "step_ms": step_ms, "void_share": 0.1, "data_wait_share": 0.0, "ranks": [],
            "ops": {"forward": {"kind": "compute", "count": 1, "total_ms": step_ms - 2,
                                "max_ms": step_ms - 2, "slowest_rank": slow_rank,
                                "per_rank_ms": per_rank},
                    "grad_sync": {"kind": "collective", "count": 1, "total_ms": 1.0,
                                  "max_ms": 1.0, "slowest_rank": 0, "per_rank_ms": [1.0, 1.0],
                                  "bytes": 4096, "group": "global", "busbw_gbps": 2.5}}}


def test_the_ops_endpoint_serves_the_latest_or_a_given_step(api, job, other_user):
    store_events(job.pk, [ops_event(s, s, 10.0 + s, s % 2) for s in (1, 2, 3)])
    latest = api.get(f"/api/jobs/{job.pk}/ops/").json()
    assert latest["step"] == 3 and latest["step_ms"] == 13.0
    assert latest["ops"]["forward"]["per_rank_ms"] == [5.0, 11.0]
    assert latest["ops"]["grad_sync"]["busbw_gbps"] == 2.5
    assert api.get(f"/api/jobs/{job.pk}/ops/", {"step": 2}).json()["step_ms"] == 12.0
    assert api.get(f"/api/jobs/{job.pk}/ops/", {"step": 9}).status_code == 404
    assert api.get(f"/api/jobs/{job.pk}/ops/", {"step": "x"}).json().keys() == {"step"}
    theirs = Job.objects.create(name="x", owner=other_user, spec=job.spec)
    assert api.get(f"/api/jobs/{theirs.pk}/ops/").status_code == 404


def test_op_history_keeps_the_slowest_step_of_each_bucket(api, job):
    times = {s: 10.0 + (500.0 if s == 77 else s % 3) for s in range(1, 401)}
    store_events(job.pk, [ops_event(s, s, times[s], 0) for s in range(1, 401)])
    history = ops_history(job.pk, max_points=40)
    assert len(history["step"]) == 40 and 77 in history["step"]
    assert max(history["step_ms"]) == 510.0
    assert history["ops"]["forward"]["total_ms"][history["step"].index(77)] == 508.0
    zoom = api.get(f"/api/jobs/{job.pk}/ops/history/", {"from": 70, "to": 80}).json()
    assert zoom["step"] == list(range(70, 81))
    assert zoom["ops"]["grad_sync"]["kind"] == "collective"


def test_expert_history_keeps_the_most_imbalanced_step_of_each_bucket(api, job):
    def experts(seq, step, violation):
        return {"type": "experts", "job": "1", "step": step, "time": 1.0, "seq": seq,
                "layers": [{"tokens_per_expert": [step, 1, 1, 1], "max_violation": violation,
                            "dead_experts": 0},
                           {"tokens_per_expert": [1, 1, 1, step], "max_violation": 0.1,
                            "dead_experts": 1}]}
    store_events(job.pk, [experts(s, s, 3.0 if s == 55 else 0.5) for s in range(1, 201)])
    samples = expert_history(job.pk, max_points=20)
    assert len(samples) == 20
    collapse = next(s for s in samples if s["max_violation"] == 3.0)
    assert collapse["step"] == 55 and collapse["tokens_per_expert"] == [[55, 1, 1, 1],
                                                                        [1, 1, 1, 55]]
    assert collapse["dead_experts"] == 1
    body = api.get(f"/api/jobs/{job.pk}/experts/", {"from": 1, "to": 3}).json()
    assert [s["step"] for s in body["samples"]] == [1, 2, 3]


def test_the_recent_ops_hold_the_newest_steps_once_each_with_rank_tables_for_the_last(job):
    store_events(job.pk, [ops_event(s, s, 10.0 + s, 0) for s in range(1, 31)])
    # a rollback to step 20: steps 21 and 22 trained again replace their first run's timings
    store_events(job.pk, [ops_event(30 + i, s, 99.0, 1) for i, s in enumerate((21, 22), 1)])
    recent = ops_recent(job.pk, keep=25, full=3)
    assert [e["step"] for e in recent] == list(range(6, 31))
    assert [e["step_ms"] for e in recent if e["step"] in (21, 22)] == [99.0, 99.0]
    assert all("per_rank_ms" in e["ops"]["forward"] for e in recent[-3:])
    older = recent[0]["ops"]
    assert "per_rank_ms" not in older["forward"]
    assert older["forward"] == {"kind": "compute", "total_ms": 14.0}
    assert older["grad_sync"]["busbw_gbps"] == 2.5 and older["grad_sync"]["group"] == "global"


def test_the_recent_ops_and_experts_stop_at_the_live_branchs_step(job):
    # a rollback from step 30 to 20: steps 21-30 stay stored until trained again
    store_events(job.pk, [ops_event(s, s, 10.0, 0) for s in range(1, 31)])
    store_events(job.pk, [{"type": "experts", "job": "1", "step": s, "time": 1.0, "seq": 30 + s,
                           "layers": [{"tokens_per_expert": [1, 1], "max_violation": 0.0,
                                       "dead_experts": 0}]} for s in range(1, 31)])
    recent = ops_recent(job.pk, keep=5, full=3, up_to=20)
    assert [e["step"] for e in recent] == [16, 17, 18, 19, 20]
    assert [e["step"] for e in experts_recent(job.pk, keep=3, up_to=20)] == [18, 19, 20]
