"""The collective checks that run on real gloo ranks: `world_report` runs every case of every
topology of the process group's size, and each rank reports what it saw per case.

A case passes when every rank's result equals what torch.distributed computes: exactly for
integers, within float tolerance for fp32 and bf16.
"""

from __future__ import annotations

import functools
import itertools
import traceback

import torch
import torch.distributed as dist

from engine.horing import (
    ALGOS,
    Topology,
    all_gather,
    all_reduce,
    reduce_scatter,
    shard_range,
    shard_size,
)
from engine.horing.cost import calibrate

SHAPES = {2: [(1, 2), (2, 1)], 4: [(1, 4), (4, 1), (2, 2)], 6: [(2, 3)], 8: [(2, 4), (4, 2)]}
# integers check bit-exactness, floats the tolerance of reordered sums; dtypes, ops and
# layouts are independent code paths, so each appears in some case rather than in all
AR_KINDS = [(torch.int64, "sum"), (torch.float32, "avg"), (torch.bfloat16, "sum")]
RS_KINDS = [(torch.int64, "sum", "rank"), (torch.int64, "sum", "nested"),
            (torch.float32, "avg", "rank"), (torch.bfloat16, "avg", "nested")]  # fmt: skip
AG_KINDS = [(torch.int64, "rank"), (torch.int64, "nested"), (torch.bfloat16, "rank")]
# small pieces so that HO-Ring runs several chunks through its pipeline even on tiny tensors
CHUNK_BYTES = 1024


def lengths(world: int) -> list[int]:
    """One element, a length not divisible by the world size, a longer odd one, and a multiple
    of the world size (which reduce_scatter reads in place instead of through a padded copy)."""
    return sorted({1, world + 1, 1001, world * 125})


def _data(numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=gen).to(dtype)
    return torch.randint(-1000, 1000, (numel,), generator=gen, dtype=dtype)


def _compare(got: torch.Tensor, want: torch.Tensor) -> str | None:
    if got.dtype.is_floating_point:
        tol = {torch.float32: 1e-5, torch.bfloat16: 4e-2}[got.dtype]
        if torch.allclose(got.float(), want.float(), rtol=tol, atol=tol * 4):
            return None
        return f"max abs error {(got.float() - want.float()).abs().max().item():.3g}"
    return None if torch.equal(got, want) else f"{(got != want).sum().item()} elements differ"


@functools.cache
def _reference(numel: int, dtype: torch.dtype, op: str, seed: int) -> torch.Tensor:
    """torch.distributed's own all-reduce of every rank's `_data(numel, dtype, seed + rank)`,
    computed once and shared by the cases of every algorithm."""
    want = _data(numel, dtype, seed + dist.get_rank())
    dist.all_reduce(want, op=dist.ReduceOp.AVG if op == "avg" else dist.ReduceOp.SUM)
    return want


def _cases(topo: Topology):
    """Yield (name, check) pairs; check() returns None or what went wrong."""
    rank, world = dist.get_rank(), topo.world_size
    for numel, algo in itertools.product(lengths(world), ALGOS):
        for dtype, op in AR_KINDS:

            def check(numel=numel, algo=algo, dtype=dtype, op=op):
                x = _data(numel, dtype, seed=numel + rank)
                want = _reference(numel, dtype, op, seed=numel)
                all_reduce(x, topo, algo=algo, op=op, chunk_bytes=CHUNK_BYTES)
                return _compare(x, want)

            yield f"all_reduce/{algo}/{dtype}/{op}/n={numel}", check

        for dtype, op, layout in RS_KINDS:

            def check(numel=numel, algo=algo, dtype=dtype, op=op, layout=layout):
                x = _data(numel, dtype, seed=numel + rank)
                kept = x.clone()
                full = _reference(numel, dtype, op, seed=numel)
                out = torch.full((shard_size(numel, world),), 7, dtype=dtype)
                reduce_scatter(
                    out, x, topo, algo=algo, op=op, layout=layout, chunk_bytes=CHUNK_BYTES
                )
                a, b = shard_range(numel, topo, rank, layout)
                want = torch.zeros_like(out)
                want[: b - a] = full[a:b]
                if not torch.equal(x, kept):
                    return "the input was modified"
                return _compare(out, want)

            yield f"reduce_scatter/{algo}/{layout}/{dtype}/{op}/n={numel}", check

        for dtype, layout in AG_KINDS:

            def check(numel=numel, algo=algo, dtype=dtype, layout=layout):
                shard = shard_size(numel, world)
                want = torch.empty(numel, dtype=dtype)
                for r in range(world):
                    a, b = shard_range(numel, topo, r, layout)
                    want[a:b] = _data(shard, dtype, seed=r * 31 + numel)[: b - a]
                out = torch.zeros(numel, dtype=dtype)
                mine = _data(shard, dtype, seed=rank * 31 + numel)
                all_gather(out, mine, topo, algo=algo, layout=layout, chunk_bytes=CHUNK_BYTES)
                return _compare(out, want)

            yield f"all_gather/{algo}/{layout}/{dtype}/n={numel}", check


def _async_case(topo: Topology) -> str | None:
    """Several async collectives in flight at once complete in issue order."""
    rank = dist.get_rank()
    xs = [_data(1000 + i, torch.int64, seed=1000 + i + rank) for i in range(3)]
    wants = [_reference(1000 + i, torch.int64, "sum", seed=1000 + i) for i in range(3)]
    handles = [all_reduce(x, topo, algo=a, async_op=True) for x, a in zip(xs, ALGOS, strict=False)]
    shard = torch.empty(shard_size(1000, topo.world_size), dtype=torch.int64)
    handles.append(reduce_scatter(shard, wants[0], topo, algo="horing", async_op=True))
    gathered = torch.empty(1000, dtype=torch.int64)
    handles.append(all_gather(gathered, shard, topo, algo="horing", async_op=True))
    for handle in handles:
        handle.wait()
    if not all(h.is_completed() for h in handles):
        return "a handle is not completed after wait()"
    for x, want in zip(xs, wants, strict=True):
        if (err := _compare(x, want)) is not None:
            return err
    return _compare(gathered, wants[0] * topo.world_size)


def _error_cases(world: int) -> dict[str, str | None]:
    """Bad topologies and arguments must fail on every rank with a message that names them."""

    def raises(fn, exc, words) -> str | None:
        try:
            fn()
        except exc as error:
            missing = [w for w in words if w not in str(error)]
            return f"message {str(error)!r} lacks {missing}" if missing else None
        return f"no {exc.__name__} raised"

    rank = dist.get_rank()
    topo = Topology(2, world // 2).init_groups()
    x = torch.zeros(10)
    shard = shard_size(10, world)
    return {
        "wrong world size": raises(
            lambda: Topology(world, 2).init_groups(), ValueError, [f"{world}x2", str(world)]
        ),
        "ranks disagree": raises(
            lambda: Topology(*((1, world) if rank == 0 else (world, 1))).init_groups(),
            ValueError,
            ["disagree", f"rank 0: 1x{world}"],
        ),
        "groups not initialised": raises(
            lambda: all_reduce(x, Topology(2, world // 2)), RuntimeError, ["init_groups"]
        ),
        "unknown algo": raises(lambda: all_reduce(x, topo, algo="tree"), ValueError, ["algo"]),
        "unknown op": raises(lambda: all_reduce(x, topo, op="max"), ValueError, ["op"]),
        "avg of integers": raises(
            lambda: all_reduce(torch.zeros(4, dtype=torch.int32), topo, op="avg"),
            ValueError,
            ["avg"],
        ),
        "wrong output size": raises(
            lambda: reduce_scatter(torch.zeros(shard + 1), x, topo), ValueError, ["output", "10"]
        ),
        "wrong input size": raises(
            lambda: all_gather(x, torch.zeros(shard + 1), topo), ValueError, ["input", "10"]
        ),
        "unknown layout": raises(
            lambda: reduce_scatter(torch.zeros(5), x, topo, layout="diagonal"),
            ValueError,
            ["layout"],
        ),
    }


def _calibration(topo: Topology) -> dict:
    links = calibrate(topo, small_bytes=1 << 10, large_bytes=64 << 10, repeats=1)
    return {
        "intra": [links.intra.latency_s, links.intra.bandwidth],
        "inter": [links.inter.latency_s, links.inter.bandwidth],
    }


def world_report() -> dict:
    """This rank's outcome (None or what went wrong) of every case, per topology."""
    world = dist.get_world_size()
    report: dict = {"cases": {}, "async": {}, "calibration": {}}
    for nodes, procs in SHAPES[world]:
        shape = f"{nodes}x{procs}"
        _reference.cache_clear()  # the references depend on the world, not the topology
        topo = Topology(nodes, procs).init_groups()
        for name, check in _cases(topo):
            try:
                report["cases"][f"{shape}/{name}"] = check()
            except Exception:  # noqa: BLE001 - reported to the test, which fails on it
                report["cases"][f"{shape}/{name}"] = traceback.format_exc()
        report["async"][shape] = _async_case(topo)
        report["calibration"][shape] = _calibration(topo)
    report["errors"] = _error_cases(world)
    return report

