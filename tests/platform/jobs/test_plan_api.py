"""GET /api/plan/: every strategy's memory and predicted step time for a model, a batch and a
layout, with the compute time from a measured job, the host's calibrated rate, or neither."""

import json
import statistics
from pathlib import Path

import pytest

from engine.horing.cost import Links, Tier
from engine.horing.topology import Topology
from engine.moe.config import flops_per_token, preset
from engine.paro.planner import DEFAULT_LINKS, plan
from engine.runtime.spec import parse_spec
from jobs import calibration
from jobs.models import Job, State
from monitor.ingest import store_events

pytestmark = pytest.mark.django_db

# A real run of the tiny preset on 1x2 CPU ranks (micro_batch 4, seq_len 256, 8 steps):
# its state, step and ops events as the engine wrote them.
TINY_RUN = Path(__file__).parent / "data" / "tiny_1x2_run.jsonl"
TINY_1X2 = {"preset": "tiny", "nodes": 1, "procs_per_node": 2, "micro_batch": 4,
            "seq_len": 256}


@pytest.fixture(autouse=True)
def sent(settings, tmp_path, monkeypatch) -> list[bool]:
    """No calibration stored yet; the calibration tasks sent (none runs)."""
    settings.RUNS_DIR = tmp_path
    calibration.cache.delete(calibration._PENDING)
    tasks: list[bool] = []
    monkeypatch.setattr(calibration.calibrate, "delay", lambda: tasks.append(True))
    return tasks


@pytest.fixture
def measured_tiny_run(user) -> tuple[Job, float]:
    """The stored tiny run and its median step time."""
    spec = parse_spec({"name": "pt12", "model": {"preset": "tiny"},
                       "parallel": {"nodes": 1, "procs_per_node": 2},
                       "train": {"steps": 8, "micro_batch": 4, "seq_len": 256}})
    job = Job.objects.create(name="pt12", owner=user, spec=spec.to_dict(),
                             state=State.COMPLETED)
    events = [json.loads(line) for line in TINY_RUN.read_text().splitlines()]
    store_events(job.pk, events)
    return job, statistics.median(e["step_time"] for e in events if e["type"] == "step")


def plans(api, **query) -> list[dict]:
    response = api.get("/api/plan/", {k: json.dumps(v) if isinstance(v, dict) else v
                                      for k, v in query.items()})
    assert response.status_code == 200, response.json()
    return response.json()["plans"]


def test_the_prediction_from_a_measured_tiny_run_is_within_30_percent_of_its_steps(
        api, measured_tiny_run):
    job, measured = measured_tiny_run
    rows = plans(api, **TINY_1X2)
    nnn = next(r for r in rows if r["strategy"] == "NNN")  # what the run trained with
    assert nnn["compute_source"] == f"measured: job {job.pk}"
    assert 0.7 <= nnn["step_time_s"] / measured <= 1.3, (nnn["step_time_s"], measured)
    assert nnn["tokens_per_s"] == pytest.approx(2 * 4 * 256 / nnn["step_time_s"])


def test_a_measured_run_prices_other_batches_of_the_same_model_by_their_flops(
        api, measured_tiny_run):
    one = plans(api, **TINY_1X2)[0]
    double = plans(api, **{**TINY_1X2, "micro_batch": 8})[0]
    assert double["compute_time_s"] == pytest.approx(2 * one["compute_time_s"])
    other_model = plans(api, **TINY_1X2, model={"num_hidden_layers": 4})[0]
    assert not other_model["compute_source"].startswith("measured")


def test_without_a_measured_job_the_calibrated_host_rate_prices_the_flops(api):
    calibration.calibration_path().write_text(json.dumps({"device": "cpu",
                                                          "flops_per_s": 50e9}))
    row = plans(api, **TINY_1X2)[0]
    assert row["compute_source"] == "calibrated training rate 50 GFLOP/s"
    # two ranks share the host's cores: each computes at half its rate
    expected = flops_per_token(preset("tiny"), 256) * 4 * 256 * 2 / 50e9
    assert row["compute_time_s"] == pytest.approx(expected)
    assert row["step_time_s"] == pytest.approx(
        row["compute_time_s"] + row["comm_time_s"], rel=0.01)


def test_an_uncalibrated_host_gives_no_step_time_and_sends_the_calibration(api, sent):
    rows = plans(api, **TINY_1X2)
    assert all(r["step_time_s"] is None and r["tokens_per_s"] is None for r in rows)
    assert rows[0]["compute_source"].startswith("unknown: ")
    assert "calibrating" in rows[0]["compute_source"]
    plans(api, **TINY_1X2)
    assert sent == [True]  # once, not per request


def test_on_one_node_strategies_that_differ_only_in_i_for_g_are_one_row(api):
    rows = plans(api, **TINY_1X2)
    names = {r["strategy"]: r["names"] for r in rows}
    assert names["NGG"] == ["NGG", "NII", "NIG"]
    assert names["GGG"] == ["GGG", "IIG", "IGG", "III"]
    assert names["ING"] == ["ING"]  # its G form, GNG, is no strategy
    assert sorted(n for r in rows for n in r["names"]) == sorted(
        ["NNN", "NNG", "NGG", "GGG", "NII", "NIG", "IIG", "IGG", "ING", "III"])
    two_nodes = plans(api, **{**TINY_1X2, "nodes": 2})
    assert all(r["names"] == [r["strategy"]] for r in two_nodes) and len(two_nodes) == 10


def test_a_bad_model_or_batch_is_400_naming_the_parameter_or_model_field(api):
    response = api.get("/api/plan/", {"preset": "tiny", "seq_len": 10**7,
                                      "model": json.dumps({"hidden_size": 0})})
    assert response.status_code == 400
    errors = response.json()  # DRF's 400: each bad field with its messages
    assert errors["seq_len"] == ["must be at most 1048576"]  # the query parameter's name
    assert errors["model.hidden_size"] == ["must be at least 1"]


def test_the_calibration_task_measures_this_host_and_the_planner_uses_it(api):
    calibration.cache.set(calibration._PENDING, True)
    found = calibration.calibrate()
    assert found["device"] == "cpu" and 1e8 < found["flops_per_s"] < 1e14
    assert {"intra", "inter"} == set(found["links"])
    assert all(t["bandwidth"] > 0 and t["latency_s"] >= 0 for t in found["links"].values())
    assert calibration.host_calibration() == found
    assert calibration.cache.get(calibration._PENDING) is None  # a later one may be sent
    row = plans(api, **{**TINY_1X2, "nodes": 2})[0]
    assert row["compute_source"] == (
        f"calibrated training rate {found['flops_per_s'] / 1e9:.0f} GFLOP/s")
    # collectives priced on the measured links (fp32 on CPU), not on the defaults
    links = Links(**{tier: Tier(**t) for tier, t in found["links"].items()})
    expected = plan(preset("tiny"), Topology(2, 2), 16e9, 1, links, dtype_bytes=4)
    assert row["comm_time_s"] == pytest.approx(
        next(r.comm_time_s for r in expected if r.strategy == row["strategy"]))


def rail_ops(step: int, median_ms: float, busbw_gbps: float) -> dict:
    """An `ops` event of a job on two hosts whose collectives over the hosts' rail took
    `median_ms` at `busbw_gbps` (and within a host, much faster)."""
    collective = {"kind": "collective", "count": 1, "collective": "all_reduce", "algo": "ring"}
    return {"type": "ops", "step": step, "seq": step, "time": 1.0 + step, "step_ms": 50.0,
            "void_share": 0.0, "data_wait_share": 0.0,
            "ranks": [{"rank": r, "step_ms": 50.0, "compute_ms": 30.0, "comm_ms": 20.0,
                       "data_ms": 0.0, "void_share": 0.0} for r in range(4)],
            "ops": {"all_reduce.inter": {**collective, "group": "inter", "median_ms": median_ms,
                                         "busbw_gbps": busbw_gbps},
                    "reduce_scatter.intra": {**collective, "group": "intra", "median_ms": 1.0,
                                             "busbw_gbps": 40.0}}}


def test_on_several_hosts_communication_is_priced_on_the_link_a_multi_host_job_measured(
        api, user):
    two_hosts = {**TINY_1X2, "nodes": 2, "hosts": 2}
    unknown = plans(api, **two_hosts)[0]
    assert unknown["link_source"].startswith("between hosts: unknown")
    assert plans(api, **{**two_hosts, "hosts": 1})[0]["link_source"] == "between nodes: this host's"

    spec = parse_spec({"name": "2h", "model": {"preset": "tiny"},
                       "parallel": {"nodes": 2, "procs_per_node": 2, "hosts": 2}})
    job = Job.objects.create(name="2h", owner=user, spec=spec.to_dict(), state=State.COMPLETED)
    store_events(job.pk, [rail_ops(step, 8.0, busbw) for step, busbw in
                          ((2, 0.5), (3, 0.9), (4, 1.0))])
    rows = {r["strategy"]: r for r in plans(api, **two_hosts)}
    assert rows["NNN"]["link_source"] == f"between hosts: 0.90 Gbit/s, measured: job {job.pk}"

    # the same prediction as the planner's on that link (latency included in its bandwidth)
    links = calibration.price_links(parse_spec({**spec.to_dict(), "name": "x"}),
                                    DEFAULT_LINKS).links
    assert links.inter == Tier(latency_s=0.0, bandwidth=0.9e9 / 8)
    expected = plan(preset("tiny"), Topology(2, 2), 16e9, 1, links, dtype_bytes=4)
    nnn = next(r for r in expected if r.strategy == "NNN")
    assert rows["NNN"]["comm_time_s"] == pytest.approx(nnn.comm_time_s)
    # a slower rail than the host's loopback: dearer than on one host
    assert rows["NNN"]["comm_time_s"] > unknown["comm_time_s"]


def test_hosts_that_do_not_divide_the_nodes_are_400_naming_hosts(api):
    response = api.get("/api/plan/", {**TINY_1X2, "nodes": 3, "hosts": 2})
    assert response.status_code == 400 and "hosts" in response.json()
