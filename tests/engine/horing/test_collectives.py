"""Every HO-Ring collective agrees with torch.distributed on real gloo ranks.

Each world of size 2, 4, 6 and 8 is spawned once and runs all cases for the topologies of
that size (1x2, 2x1, 1x4, 4x1, 2x2, 2x3, 2x4, 4x2): every algorithm for all-reduce,
reduce-scatter and all-gather, over both shard layouts, int64 / fp32 / bf16, sum and avg,
lengths 1, W+1 and 1001, with small pipeline chunks so that HO-Ring's pipeline runs several
chunks.
"""

from __future__ import annotations

import math

import pytest

from engine.horing import ALGOS
from tests.engine.horing.horing_ranks import (
    AG_KINDS,
    AR_KINDS,
    RS_KINDS,
    SHAPES,
    lengths,
    world_report,
)
from tests.engine.ranks import run_ranks

WORLDS = sorted(SHAPES)


@pytest.fixture(scope="module")
def reports() -> dict[int, list[dict]]:
    """Per world size, every rank's report; each world is spawned once for the module."""
    return {world: run_ranks(world_report, procs_per_node=world, timeout_s=120)
            for world in WORLDS}


def _failures(ranks: list[dict], section: str, prefix: str) -> tuple[int, dict[str, str]]:
    """How many cases under `prefix` ran, and which failed on which rank."""
    seen, failed = set(), {}
    for rank, report in enumerate(ranks):
        for name, error in report[section].items():
            if name.startswith(prefix):
                seen.add(name)
                if error is not None:
                    failed[f"rank {rank}: {name}"] = error
    return len(seen), failed


SHAPE_PARAMS = [(w, f"{n}x{p}") for w in WORLDS for n, p in SHAPES[w]]


@pytest.mark.parametrize(("world", "shape"), SHAPE_PARAMS)
@pytest.mark.parametrize(
    ("collective", "per_length"),
    [
        ("all_reduce", len(ALGOS) * len(AR_KINDS)),
        ("reduce_scatter", len(ALGOS) * len(RS_KINDS)),
        ("all_gather", len(ALGOS) * len(AG_KINDS)),
    ],
)
def test_matches_torch_distributed(reports, world, shape, collective, per_length):
    ran, failed = _failures(reports[world], "cases", f"{shape}/{collective}/")
    assert ran == per_length * len(lengths(world))
    assert not failed, failed


@pytest.mark.parametrize(("world", "shape"), SHAPE_PARAMS)
def test_async_handles_complete_in_issue_order(reports, world, shape):
    for report in reports[world]:
        assert report["async"][shape] is None, report["async"][shape]


@pytest.mark.parametrize("world", WORLDS)
def test_bad_topologies_and_arguments_raise_clear_errors(reports, world):
    for rank, report in enumerate(reports[world]):
        assert len(report["errors"]) == 9
        assert not {k: v for k, v in report["errors"].items() if v}, f"rank {rank}"


@pytest.mark.parametrize(("world", "shape"), SHAPE_PARAMS)
def test_calibration_measures_the_tiers_the_topology_has(reports, world, shape):
    nodes, procs = map(int, shape.split("x"))
    for report in reports[world]:
        links = report["calibration"][shape]
        for tier, used in (("intra", procs > 1), ("inter", nodes > 1)):
            latency, bandwidth = links[tier]
            assert latency >= 0
            if used:
                assert 0 < bandwidth < math.inf
            else:
                assert (latency, bandwidth) == (0.0, math.inf)
