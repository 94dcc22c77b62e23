"""The planner against the spec's worked examples (section 4 and 5) and rules of thumb (7)."""

from __future__ import annotations

import pytest

from engine.contract import STRATEGIES
from engine.horing.cost import Links, Tier
from engine.horing.topology import Topology
from engine.moe import param_count, preset
from engine.moe.config import flops_per_token
from engine.paro.planner import (
    compute_time_s,
    effective_flops_per_s,
    main,
    merge_equivalent,
    plan,
    ranks_per_device,
)

PSI_7B, PSI_65B = 6.74e9, 65.2e9
GB = 1e9
# intra 100 GB/s, inter 12.5 GB/s (100 Gbit/s) per rank: B_intra = 8 B_inter
LINKS = Links(intra=Tier(5e-6, 100 * GB), inter=Tier(20e-6, 12.5 * GB))

# spec section 4: GB per GPU, g = 8
MEMORY_TABLE = {  # 7B full N=32 | 65B full N=64 | 65B Psi/16 | 65B 0.003 Psi
    "NNN": (107.8, 1043.2, 187.4, 133.1),
    "NNG": (29.5, 273.0, 139.3, 130.8),
    "NGG": (16.4, 144.7, 131.3, 130.4),
    "GGG": (3.4, 16.3, 2.9, 2.1),
    "NII": (25.3, 244.5, 137.5, 130.7),
    "NIG": (17.7, 158.9, 132.2, 130.5),
    "IIG": (5.9, 44.8, 18.1, 16.4),
    "IGG": (4.6, 30.6, 17.2, 16.3),
    "ING": (17.7, 158.9, 25.2, 16.7),
    "III": (13.5, 130.4, 23.4, 16.6),
}
COLUMNS = [
    (PSI_7B, 1.0, Topology(4, 8)),
    (PSI_65B, 1.0, Topology(8, 8)),
    (PSI_65B, 1 / 16, Topology(8, 8)),
    (PSI_65B, 0.003, Topology(8, 8)),
]


def rows_by_name(psi, fraction, topo, budget=0.0, accum=4, **kw):
    rows = plan(int(psi), topo, budget, accum, LINKS, trainable=int(psi * fraction), **kw)
    return {r.strategy: r for r in rows}


@pytest.mark.parametrize("column", range(4))
def test_memory_matches_the_spec_table(column):
    psi, fraction, topo = COLUMNS[column]
    rows = rows_by_name(psi, fraction, topo)
    for name, expected in MEMORY_TABLE.items():
        assert rows[name].memory_bytes / GB == pytest.approx(expected[column], abs=0.051), name


# spec section 5, 65B full, N=64, g=8, A=4, GB per GPU per step (bf16). NII's rail
# all-reduce runs in fp32, so its inter volume is twice the table's bf16 figure.
TRAFFIC_65B = {  # inter, intra
    "NNN": (28.5, 228),
    "NNG": (28.5, 228),
    "NGG": (71.3, 571),
    "GGG": (171.2, 1369),
    "NII": (2 * 28.5, 571),
    "NIG": (28.5, 571),
    "IIG": (28.5, 1369),
    "III": (28.5, 1369),
    "IGG": (71.3, 1369),
    "ING": (28.5, 1027),
}


def test_predicted_traffic_matches_the_spec_table():
    rows = rows_by_name(PSI_65B, 1.0, Topology(8, 8), accum=4)
    for name, (inter, intra) in TRAFFIC_65B.items():
        assert rows[name].inter_bytes / GB == pytest.approx(inter, abs=0.1), name
        assert rows[name].intra_bytes / GB == pytest.approx(intra, abs=1.0), name


@pytest.mark.parametrize(
    "budget_gb, pick",
    [
        (200, "NNG"),  # everything fits: NNN's traffic, 1/N of its optimizer work
        (40, "NNG"),  # full params and 2 Psi' of gradients fit
        (20, "NIG"),  # full params fit, full gradients do not
        (10, "IIG"),  # only 2 Psi / g of parameters fits, and 2 Psi' / g of gradients
        (5, "IGG"),  # ... but not those gradients
        (4, "GGG"),  # last resort
    ],
)
def test_ranking_follows_the_rules_of_thumb_for_full_training(budget_gb, pick):
    rows = plan(int(PSI_7B), Topology(4, 8), budget_gb * GB, 4, LINKS, compute_time_s=0.5)
    assert rows[0].strategy == pick and rows[0].fits


def test_parameter_efficient_training_picks_ing():
    psi = int(PSI_65B)
    rows = plan(psi, Topology(8, 8), 17 * GB, 4, LINKS, trainable=int(0.003 * psi))
    assert rows[0].strategy == "ING"


def test_rows_fit_first_fastest_first_and_the_rest_by_memory():
    rows = plan(int(PSI_7B), Topology(4, 8), 20 * GB, 4, LINKS)
    assert sorted(r.strategy for r in rows) == sorted(STRATEGIES)
    fitting = [r for r in rows if r.fits]
    rest = rows[len(fitting) :]
    assert all(r.memory_bytes <= 20 * GB for r in fitting)
    assert all(not r.fits for r in rest)
    assert [r.step_time_s for r in fitting] == sorted(r.step_time_s for r in fitting)
    assert [r.memory_bytes for r in rest] == sorted(r.memory_bytes for r in rest)


def test_more_accumulation_favours_unsharded_gradients():
    """NGG pays a rail reduce-scatter per micro-step, NIG one per optimizer step."""

    def gap(accum):
        rows = rows_by_name(PSI_7B, 1.0, Topology(4, 8), accum=accum)
        return rows["NGG"].comm_time_s - rows["NIG"].comm_time_s

    assert gap(8) > gap(2) > 0


def test_an_moe_config_is_counted_by_the_model():
    config = preset("tiny")
    rows = plan(config, Topology(2, 2), 1e12, 1, LINKS, dtype_bytes=4)
    nnn = next(r for r in rows if r.strategy == "NNN")
    assert nnn.memory_bytes == 16 * param_count(config)  # fp32: params, grads, m, v


@pytest.mark.parametrize(
    "kwargs, field",
    [({"grad_accum": 0}, "grad_accum"), ({"memory_budget_bytes": -1}, "memory_budget_bytes")],
)
def test_bad_arguments_name_the_field(kwargs, field):
    args = {
        "model_config": 1000,
        "topology": Topology(2, 2),
        "memory_budget_bytes": 1e9,
        "grad_accum": 1,
        "links": LINKS,
    } | kwargs
    with pytest.raises(ValueError, match=field):
        plan(**args)


def test_the_command_prints_every_strategy(capsys):
    main(
        [
            "--params",
            "6.74e9",
            "--nodes",
            "4",
            "--procs-per-node",
            "8",
            "--budget-gb",
            "20",
            "--grad-accum",
            "4",
        ]
    )
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[2].split()[:3] == ["1", "NIG", "yes"]
    assert all(name in out for name in STRATEGIES)


def test_on_one_node_strategies_that_differ_only_in_i_for_g_are_one_row_with_every_name():
    topo = Topology(1, 4)
    rows = plan(preset("tiny"), topo, 80 * GB, 2, LINKS)
    merged = merge_equivalent(rows, topo)
    assert {r.strategy: r.names for r in merged} == {
        "NNN": ("NNN",), "NNG": ("NNG",), "NGG": ("NGG", "NII", "NIG"),
        "GGG": ("GGG", "IIG", "IGG", "III"), "ING": ("ING",)}
    by_name = {r.strategy: r for r in rows}
    for row in merged:  # the names of one row really are one strategy on one node
        for name in row.names:
            assert by_name[name].memory_bytes == pytest.approx(row.memory_bytes)
            assert by_name[name].step_time_s == pytest.approx(row.step_time_s, rel=0.05)
    two_nodes = merge_equivalent(plan(preset("tiny"), Topology(2, 2), 80 * GB, 2, LINKS),
                                 Topology(2, 2))
    assert [r.names for r in two_nodes] == [(r.strategy,) for r in two_nodes]


def test_compute_time_is_the_flops_of_a_micro_batch_at_the_devices_rate_shared_by_its_ranks():
    tiny = preset("tiny")
    one = compute_time_s(tiny, 256, 4, 50e9)
    assert one == pytest.approx(flops_per_token(tiny, 256) * 4 * 256 / 50e9)
    assert compute_time_s(tiny, 256, 4, 50e9, sharing=ranks_per_device(4, "cpu")) == 4 * one
    assert ranks_per_device(4, "cuda", devices=2) == 2 and ranks_per_device(4, "cpu") == 4
    # the rate a measured step shows prices that step back exactly
    rate = effective_flops_per_s(tiny, 256, 4 * 256 * 2, compute_s=1.5, sharing=2)
    assert 2 * compute_time_s(tiny, 256, 4, rate, sharing=2) == pytest.approx(1.5)


def test_flops_per_token_is_six_per_active_matrix_weight_plus_causal_attention():
    tiny = preset("tiny")
    weights = param_count(tiny, active=True) - tiny.vocab_size * tiny.hidden_size
    at_zero = flops_per_token(tiny, 0)
    assert at_zero == 6 * weights
    layers = tiny.num_hidden_layers + tiny.num_nextn_predict_layers
    assert flops_per_token(tiny, 256) - at_zero == 6 * layers * 256 * 4 * 64
