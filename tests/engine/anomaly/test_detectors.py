"""Detectors fire exactly when their rule says, and stay quiet on healthy, noisy runs."""

from __future__ import annotations

import math
import random

import pytest

from engine.anomaly import Detectors, EwmaZ
from engine.anomaly.policy import FaultPolicy
from engine.errors import SpecError


def healthy_run(seed: int, steps: int = 300):
    """A realistic clean run: loss falling from ln(256) with noise and heavy-ish tails,
    decaying noisy grad norms, steady throughput with periodic checkpoint steps, memory
    that settles after warm-up."""
    rng = random.Random(seed)
    for step in range(1, steps + 1):
        loss = 2.0 + 3.5 * math.exp(-step / 60)
        loss *= 1 + 0.03 * rng.gauss(0, 1) + (0.05 * rng.random() if rng.random() < 0.03 else 0)
        grad = (0.6 + 4.0 * math.exp(-step / 30)) * math.exp(0.2 * rng.gauss(0, 1))
        tokens = 8000 * (1 + 0.05 * rng.gauss(0, 1)) / (3 if step % 50 == 0 else 1)
        memory = 2e9 * (1 - 0.3 * math.exp(-step / 10)) + 2e6 * rng.gauss(0, 1)
        yield step, loss, grad, tokens, memory


def balanced_experts(rng: random.Random, experts: int = 8, tokens: int = 2048) -> dict:
    weights = [1 + 0.3 * rng.random() for _ in range(experts)]
    counts = [0] * experts
    for e in rng.choices(range(experts), weights, k=tokens):
        counts[e] += 1
    return {"layer1": {"tokens_per_expert": counts}}


def rank_rows(rng: random.Random, slow: dict[int, float] | None = None) -> dict:
    rows = []
    for rank in range(4):
        compute = 100 * (1 + 0.15 * rng.random()) * (slow or {}).get(rank, 1.0)
        rows.append({"rank": rank, "compute_ms": compute, "comm_ms": 400 - compute})
    return {"ranks": rows}


@pytest.mark.parametrize("seed", range(10))
def test_default_thresholds_stay_quiet_on_a_clean_300_step_run(seed):
    detectors = Detectors()
    rng = random.Random(1000 + seed)
    found = []
    for step, loss, grad, tokens, memory in healthy_run(seed):
        found += detectors.check_step(step, loss=loss, grad_norm=grad, tokens_per_s=tokens,
                                      memory_bytes=memory)
        found += detectors.check_ops(step, rank_rows(rng))
        if step % 3 == 0:  # expert stats are cheaper to sample
            found += detectors.check_experts(step, balanced_experts(rng))
    assert found == []


def feed(detectors: Detectors, until: int, seed: int = 0) -> None:
    for step, loss, grad, _, _ in healthy_run(seed, until):
        assert detectors.check_step(step, loss=loss, grad_norm=grad) == []


@pytest.mark.parametrize("at", [8, 25, 60, 250])
def test_loss_spike_fires_in_the_step_it_happens(at):
    detectors = Detectors(rank=1)
    feed(detectors, at - 1)
    loss = 2.0 + 3.5 * math.exp(-at / 60)
    (spike,) = detectors.check_step(at, loss=10 * loss)
    assert (spike.kind, spike.step, spike.rank) == ("loss_spike", at, 1)
    assert spike.evidence["value"] == 10 * loss
    assert spike.evidence["z"] > spike.evidence["z_threshold"] == 4.0
    # the flagged value is not folded in: the next normal step is quiet
    assert detectors.check_step(at + 1, loss=loss) == []


def test_ten_times_the_max_is_catastrophic_even_with_a_wide_variance():
    ewma = EwmaZ(alpha=0.02, warmup=5, z=1e9, min_rise=0.25, max_factor=10, max_after=100,
                 wide=3)
    for i in range(100):
        assert ewma.update(1.0 + (i % 2)) is None
    evidence = ewma.update(20.5)
    assert evidence["rule"] == "max_factor" and evidence["max_seen"] == 2.0


def test_the_noise_of_a_healthy_small_batch_run_is_no_spike():
    """Measured on a healthy nano run (8 x 64 tokens a step): the loss 1.4x its running mean
    at z 3.6, the pre-clip gradient norm 3.8x at z 27: ordinary, answered by nothing."""
    detectors = Detectors()
    feed(detectors, 299)
    loss = 2.0 + 3.5 * math.exp(-300 / 60)
    grad = detectors.grad.mean
    assert detectors.check_step(300, loss=1.4 * loss, grad_norm=3.8 * grad) == []


def test_three_flagged_steps_in_a_row_make_a_wide_spike():
    detectors = Detectors()
    feed(detectors, 49)
    spikes = [detectors.check_step(s, loss=10.0)[0] for s in (50, 51, 52)]
    assert [s.severity for s in spikes] == ["warning", "warning", "error"]
    assert spikes[-1].evidence["wide"] and spikes[-1].evidence["flagged_in_a_row"] == 3


def test_nan_or_inf_in_loss_or_grad_norm_fires_nan_and_spares_the_statistics():
    detectors = Detectors(rank=2)
    feed(detectors, 30)
    state = detectors.state_dict()
    (nan,) = detectors.check_step(31, loss=float("nan"), grad_norm=1.0)
    assert (nan.kind, nan.severity, nan.rank) == ("nan", "critical", 2)
    assert nan.evidence == {"loss": "nan", "threshold": "finite"}
    (inf,) = detectors.check_step(32, loss=2.5, grad_norm=float("inf"))
    assert inf.evidence == {"grad_norm": "inf", "threshold": "finite"}
    assert inf.rank is None  # the grad norm is global: no single rank to blame
    assert detectors.state_dict()["loss"] == state["loss"]


def test_grad_norm_spike():
    detectors = Detectors()
    feed(detectors, 120)  # past the grad-norm warm-up
    (spike,) = detectors.check_step(121, loss=2.7, grad_norm=50.0)
    assert spike.kind == "grad_spike" and spike.evidence["value"] == 50.0
    assert spike.rank is None


def test_throughput_drop_fires_once_when_the_window_median_falls_below_70_percent():
    detectors = Detectors()
    found = []
    for step in range(1, 61):
        tokens = 8000 if step <= 30 else 4000  # e.g. a slowed rank from step 31
        found += [(step, a) for a in detectors.check_step(step, tokens_per_s=tokens)]
    ((step, drop),) = found
    assert 31 <= step <= 31 + 10 // 2  # half the window of slow steps moves the median
    assert drop.evidence["ratio"] == 0.5 and drop.evidence["threshold"] == 0.7


def test_straggler_names_the_slow_rank_within_10_steps():
    detectors = Detectors()
    rng = random.Random(0)
    fired = []
    for step in range(1, 41):
        slow = {3: 3.0} if step > 20 else None
        fired += [(step, a) for a in detectors.check_ops(step, rank_rows(rng, slow))]
    ((step, straggler),) = fired
    assert straggler.rank == 3 and step <= 20 + 10
    assert straggler.evidence["score"] < straggler.evidence["threshold"] == 0.5
    assert set(straggler.evidence["compute_ms_per_rank"]) == {0, 1, 2, 3}


def starved_rows(rng: random.Random, starved: int, waited_ms: float) -> dict:
    """Four ranks sharing busy cores: every rank waits ~50 ms a step for a core, `starved`
    `waited_ms` more, and its step is longer by exactly that."""
    rows = rank_rows(rng)
    for row in rows["ranks"]:
        extra = waited_ms if row["rank"] == starved else 0.0
        row["cpu_wait_ms"] = 50 + 5 * rng.random() + extra
        row["compute_ms"] += row["cpu_wait_ms"]
    return rows


def test_a_rank_starved_of_cpu_by_other_processes_is_not_a_straggler_and_a_slow_one_still_is():
    """The time a rank waited for a core beyond the others' is the host's contention; a rank
    slow at its own work (it waits no longer for a core than they do) is still named."""
    detectors = Detectors()
    rng = random.Random(0)
    for step in range(1, 41):
        assert detectors.check_ops(step, starved_rows(rng, starved=2, waited_ms=400)) == []
    fired = []
    for step in range(41, 61):
        rows = starved_rows(rng, starved=2, waited_ms=400)
        rows["ranks"][3]["compute_ms"] *= 3
        fired += [(step, a) for a in detectors.check_ops(step, rows)]
    ((step, straggler),) = fired
    assert straggler.rank == 3 and step <= 40 + 10


def test_a_straggler_that_stays_slow_is_named_again_every_persist_steps():
    detectors = Detectors(FaultPolicy(thresholds={"straggler": {"persist": 15}}))
    rng = random.Random(0)
    fired = []
    for step in range(1, 71):
        fired += [(step, a) for a in detectors.check_ops(step, rank_rows(rng, {3: 3.0}))]
    steps = [step for step, _ in fired]
    assert [a.rank for _, a in fired] == [3, 3, 3, 3]
    assert [b - a for a, b in zip(steps, steps[1:], strict=False)] == [15, 15, 15]
    assert [a.evidence["persisting"] for _, a in fired] == [False, True, True, True]


def test_expert_collapse_fires_when_routing_concentrates():
    detectors = Detectors()
    rng = random.Random(0)
    for step in range(1, 60):
        assert detectors.check_experts(step, balanced_experts(rng)) == []
    collapsed = {"layer1": {"tokens_per_expert": [1900, 148, 0, 0, 0, 0, 0, 0]}}
    fired = []
    for step in range(60, 260):  # past the warm-up of the router's own balancing
        fired += detectors.check_experts(step, collapsed)
    (collapse,) = fired
    assert collapse.kind == "expert_collapse" and collapse.evidence["layer"] == "layer1"
    assert collapse.evidence["load_entropy"] < 0.6 or collapse.evidence["dead_experts"] >= 4


def test_memory_growth_fires_on_a_steady_leak():
    detectors = Detectors(rank=1)
    fired = []
    for step in range(1, 200):
        fired += detectors.check_step(step, memory_bytes=1e9 * (1 + 0.002 * step))
    (leak,) = fired
    assert leak.kind == "memory_growth" and leak.rank == 1 and leak.step == 120


def test_policy_thresholds_override_defaults_and_bad_ones_name_the_field():
    detectors = Detectors(FaultPolicy(thresholds={"loss_spike": {"z": 6.0}}))
    assert detectors.thresholds["loss_spike"]["z"] == 6.0
    assert detectors.thresholds["loss_spike"]["alpha"] == 0.02
    with pytest.raises(SpecError) as e:
        Detectors(FaultPolicy(thresholds={"loss_spkie": {}, "nan": {"z": 1},
                                          "grad_spike": {"alpha": 2.0, "z": -1}}))
    assert set(e.value.errors) == {
        "faults.policy.thresholds.loss_spkie", "faults.policy.thresholds.nan.z",
        "faults.policy.thresholds.grad_spike.alpha", "faults.policy.thresholds.grad_spike.z"}


def test_state_dict_round_trip_continues_identically():
    a = Detectors()
    feed(a, 150)
    b = Detectors()
    b.load_state_dict(a.state_dict())
    for step, loss, grad, tokens, memory in healthy_run(7, 40):
        step += 150
        values = {"loss": loss, "grad_norm": grad, "tokens_per_s": tokens, "memory_bytes": memory}
        assert a.check_step(step, **values) == b.check_step(step, **values)
    assert a.state_dict() == b.state_dict()
