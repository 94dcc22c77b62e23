"""The alpha-beta cost model: formulas, orderings and input checks."""

from __future__ import annotations

import pytest

from engine.horing import Topology
from engine.horing.cost import Links, Tier, lower_bound, predict

MB = 1 << 20
# a node 10x faster inside than between nodes, 1 Gbit/s NICs
LINKS = Links(intra=Tier(20e-6, 1.25e9), inter=Tier(100e-6, 1.25e8))


def test_flat_ring_pays_every_step_on_the_slowest_tier():
    topo = Topology(2, 2)
    s = 32 * MB
    assert predict("ring", "all_reduce", s, topo, LINKS) == pytest.approx(
        2 * 3 * (100e-6 + s / 4 / 1.25e8)
    )
    assert predict("ring", "all_gather", s, topo, LINKS) == pytest.approx(
        3 * (100e-6 + s / 4 / 1.25e8)
    )
    # on one node the ring never leaves it
    assert predict("ring", "all_reduce", s, Topology(1, 4), LINKS) == pytest.approx(
        2 * 3 * (20e-6 + s / 4 / 1.25e9)
    )


def test_hierarchical_is_its_stages_in_sequence():
    topo, s = Topology(2, 2), 32 * MB
    intra = 1 * (20e-6 + s / 2 / 1.25e9)  # g-1 steps of S/g
    inter = 1 * (100e-6 + s / 4 / 1.25e8)  # R-1 steps of S/(gR), every rail at once
    assert predict("hier", "all_reduce", s, topo, LINKS) == pytest.approx(2 * intra + 2 * inter)
    assert predict("hier", "reduce_scatter", s, topo, LINKS) == pytest.approx(intra + inter)


def test_horing_overlaps_the_tiers_and_beats_ring_and_hier_on_large_buffers():
    topo, s = Topology(2, 2), 32 * MB
    ring, hier, horing = (
        predict(a, "all_reduce", s, topo, LINKS) for a in ("ring", "hier", "horing")
    )
    assert horing < hier < ring
    # pipelined, it approaches the inter-node bandwidth bound
    bound = lower_bound("all_reduce", s, topo, LINKS.inter)
    assert bound <= horing < 1.1 * bound
    # with a single chunk there is nothing to overlap
    assert predict("horing", "all_reduce", s, topo, LINKS, chunk_bytes=s) == pytest.approx(hier)


def test_no_algorithm_beats_the_lower_bound():
    for shape in ((2, 2), (2, 4), (4, 2), (3, 1)):
        topo = Topology(*shape)
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            bound = lower_bound(op, 8 * MB, topo, LINKS.inter)
            for algo in ("native", "ring", "hier", "horing"):
                assert predict(algo, op, 8 * MB, topo, LINKS) >= bound, (shape, op, algo)


def test_a_single_node_has_no_inter_node_bound():
    assert lower_bound("all_reduce", MB, Topology(1, 8), LINKS.inter) == 0.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: predict("tree", "all_reduce", 1, Topology(2, 2), LINKS), "algo must be one of"),
        (lambda: predict("ring", "broadcast", 1, Topology(2, 2), LINKS), "op must be one of"),
        (lambda: predict("ring", "all_reduce", -1, Topology(2, 2), LINKS), "nbytes must be >= 0"),
        (lambda: lower_bound("gather", 1, Topology(2, 2), LINKS.inter), "op must be one of"),
        (lambda: Tier(1e-6, 0), "bandwidth must be positive"),
        (lambda: Tier(-1, 1e9), "latency_s must be >= 0"),
    ],
)
def test_bad_inputs_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()
