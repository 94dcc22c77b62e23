"""Topology maps ranks to (node, local rank): rank = node * procs_per_node + local."""

from __future__ import annotations

import pytest

from engine.horing import Topology, shard_block, shard_range, shard_size
from engine.runtime.spec import ParallelSpec


def test_ranks_map_to_nodes_and_rails():
    topo = Topology(2, 3)
    assert topo.world_size == 6
    assert [(topo.node_of(r), topo.local_rank_of(r)) for r in range(6)] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2),
    ]  # fmt: skip
    assert all(topo.rank_of(topo.node_of(r), topo.local_rank_of(r)) == r for r in range(6))
    assert topo.node_ranks(1) == [3, 4, 5]
    assert topo.rail_ranks(2) == [2, 5]


def test_built_from_the_job_spec_and_the_launch_environment(monkeypatch):
    assert Topology.from_parallel(ParallelSpec(nodes=4, procs_per_node=2)) == Topology(4, 2)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert Topology.from_env() == Topology(2, 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="WORLD_SIZE 8 is not a multiple of LOCAL_WORLD_SIZE 3"):
        Topology.from_env()


@pytest.mark.parametrize(("nodes", "procs"), [(0, 2), (2, 0), (-1, 1)])
def test_empty_topologies_are_rejected(nodes, procs):
    with pytest.raises(ValueError, match="nodes >= 1 and procs_per_node >= 1"):
        Topology(nodes, procs)


def test_rank_layout_gives_block_r_to_rank_r():
    topo = Topology(2, 2)
    assert [shard_block(topo, r) for r in range(4)] == [0, 1, 2, 3]


def test_nested_layout_puts_each_global_block_inside_its_node_shard():
    # PaRO's layout (spec section 6): rank (k, j) owns block j*R + k
    topo = Topology(2, 2)
    assert [shard_block(topo, r, "nested") for r in range(4)] == [0, 2, 1, 3]
    topo = Topology(3, 2)
    for rank in range(6):
        local = topo.local_rank_of(rank)
        node_shard = range(local * 3, local * 3 + 3)
        assert shard_block(topo, rank, "nested") in node_shard


def test_shards_cover_any_length_once():
    topo = Topology(2, 3)
    for numel in (0, 1, 5, 6, 7, 1001):
        assert shard_size(numel, 6) == -(-numel // 6)
        for layout in ("rank", "nested"):
            ranges = sorted(shard_range(numel, topo, r, layout) for r in range(6))
            covered = [i for a, b in ranges for i in range(a, b)]
            assert covered == list(range(numel))


def test_unknown_layout_is_rejected():
    with pytest.raises(ValueError, match="layout must be one of rank, nested; got 'diagonal'"):
        shard_block(Topology(2, 2), 0, "diagonal")
