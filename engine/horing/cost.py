"""Alpha-beta cost model of the collectives in engine.horing.collectives.

A ring step that moves b bytes over a tier costs `latency + b / bandwidth`; the tiers are
intra-node (between ranks of one node) and inter-node (one NIC per rail). With R nodes of
g ranks (N = R*g) and S bytes:

    ring    all-reduce 2(N-1) steps of S/N on the slowest tier the ring crosses;
            reduce-scatter and all-gather (N-1) steps
    hier    stages in sequence: intra RS (g-1 steps of S/g), inter RS then AG on every rail
            at once (R-1 steps of S/(gR) each), intra AG (g-1 steps of S/g)
    horing  the same stages on pieces of S in a pipeline (c pieces of S/c, the first and
            last cut into quarters): the time of the first piece through all stages, then
            for each further piece the transfer time of the busiest tier (the stages on one
            tier share its links; their latencies overlap other transfers)
    native  torch.distributed's own, modelled as gloo runs it: a flat ring, whose
            reduce-scatter costs as much as an all-reduce

`calibrate(topo)` measures both tiers with short ring probes on the real groups (all nodes,
or all rails, at once, as the collectives use them), so the intra bandwidth includes the
reductions and copies the ranks do on their cores. The PaRO planner uses `predict`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.contract import COLLECTIVES as ALGOS  # here COLLECTIVES names the ops
from engine.horing.chunks import DEFAULT_CHUNK_BYTES, chunk_count, pipeline_split, split
from engine.horing.topology import Topology

if TYPE_CHECKING:
    import torch

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


@dataclass(frozen=True)
class Tier:
    latency_s: float  # per ring step
    bandwidth: float  # bytes per second per rank

    def __post_init__(self) -> None:
        if self.latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {self.latency_s}")
        if self.bandwidth <= 0:
            raise ValueError(f"bandwidth must be positive, got {self.bandwidth}")

    def step(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth


@dataclass(frozen=True)
class Links:
    intra: Tier
    inter: Tier


def _stages(op: str, chunk: float, topo: Topology, links: Links) -> list[tuple[Tier, int, float]]:
    """(tier, ring steps, bytes per step) of each stage that moves data, for one chunk."""
    g, r = topo.procs_per_node, topo.nodes
    intra = (links.intra, g - 1, chunk / g)
    inter = (links.inter, r - 1, chunk / (g * r))
    stages = {
        "all_reduce": [intra, inter, inter, intra],
        "reduce_scatter": [intra, inter],
        "all_gather": [inter, intra],
    }[op]
    return [stage for stage in stages if stage[1] > 0]


def predict(
    algo: str,
    op: str,
    nbytes: int,
    topo: Topology,
    links: Links,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> float:
    """Predicted seconds for `op` (all_reduce | reduce_scatter | all_gather) of an `nbytes`
    buffer (the full buffer, also for reduce-scatter and all-gather) with `algo`, cut into
    pieces of `chunk_bytes`, as the collectives cut it."""
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {', '.join(ALGOS)}; got {algo!r}")
    if op not in COLLECTIVES:
        raise ValueError(f"op must be one of {', '.join(COLLECTIVES)}; got {op!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    n = topo.world_size
    if algo in ("ring", "native"):
        tier = links.inter if topo.nodes > 1 else links.intra
        # gloo's reduce-scatter reduces the whole buffer everywhere: an all-reduce's cost
        halves = 1 if op == "all_gather" or (algo == "ring" and op == "reduce_scatter") else 2
        return halves * (n - 1) * tier.step(nbytes / n)
    # the collectives' own chunking, so the model prices the pieces they send
    count = chunk_count(algo, nbytes, nbytes, chunk_bytes)
    pieces = [b - a for a, b in pipeline_split(0, nbytes, count)]
    first = _stages(op, pieces[0], topo, links)
    if not first:
        return 0.0
    one_piece = sum(steps * tier.step(size) for tier, steps, size in first)
    # in the pipeline the stages on one tier share its links, while their per-step latencies
    # overlap with other stages' transfers: after the first piece, each further piece costs
    # the busiest tier's transfer time
    later = 0.0
    for piece in pieces[1:]:
        busy: dict[int, float] = {}
        for tier, steps, size in _stages(op, piece, topo, links):
            busy[id(tier)] = busy.get(id(tier), 0.0) + steps * size / tier.bandwidth
        later += max(busy.values())
    return one_piece + later


def lower_bound(op: str, nbytes: int, topo: Topology, inter: Tier) -> float:
    """Least time any algorithm needs on the inter-node links: every node must send out
    (R-1)/R of the buffer per reduce-scatter or all-gather half, over its g NICs."""
    if op not in COLLECTIVES:
        raise ValueError(f"op must be one of {', '.join(COLLECTIVES)}; got {op!r}")
    r, g = topo.nodes, topo.procs_per_node
    if r == 1:
        return 0.0
    halves = 2 if op == "all_reduce" else 1
    return halves * ((r - 1) / r * nbytes / (g * inter.bandwidth) + inter.latency_s)


def calibrate(
    topo: Topology,
    small_bytes: int = 4 << 10,
    large_bytes: int = 16 << 20,
    repeats: int = 5,
    dtype: torch.dtype | None = None,
) -> Links:
    """Measure both tiers with ring all-reduce probes (reduce-scatter + all-gather, so the
    reductions are priced in) on every node's intra group, then on every rail at once, in
    `dtype` (default float32). Collective: every rank calls it; all ranks get the same
    answer."""
    import torch  # here: the rest of the cost model is arithmetic the platform runs

    dtype = dtype or torch.float32
    intra = _probe(topo, "intra", small_bytes, large_bytes, repeats, dtype)
    inter = _probe(topo, "inter", small_bytes, large_bytes, repeats, dtype)
    return Links(intra=intra, inter=inter)


def _probe(
    topo: Topology, tier: str, small: int, large: int, repeats: int, dtype: torch.dtype
) -> Tier:
    import torch
    import torch.distributed as dist

    from engine.horing.collectives import _ring_all_gather, _ring_reduce_scatter

    me = dist.get_rank()
    if tier == "intra":
        ring, group = topo.node_ranks(topo.node_of(me)), topo.intra
    else:
        ring, group = topo.rail_ranks(topo.local_rank_of(me)), topo.inter
    size = len(ring)
    if size == 1:  # the tier is unused by this topology
        return Tier(0.0, float("inf"))
    itemsize = torch.empty((), dtype=dtype).element_size()
    step_times = []
    for nbytes in (small, large):
        flat = torch.zeros(max(size, nbytes // itemsize), dtype=dtype)
        pieces = [[r] for r in split(0, flat.numel(), size)]
        # one receive buffer for every round, as the collectives keep theirs: a fresh one
        # costs a page fault per 4 KiB on first touch, which halved the intra bandwidth
        # measured on the emulated cluster (325 MB/s probed, 615 MB/s in hier's intra phases)
        received = flat.new_empty(flat.numel())
        samples = []
        for _ in range(repeats + 1):  # the first round warms up connections and buffers
            dist.barrier(group=topo.global_group)
            start = time.perf_counter()
            _ring_reduce_scatter(flat, pieces, ring, group, lambda n, buf=received: buf[:n])
            _ring_all_gather(flat, pieces, ring, group)
            samples.append(time.perf_counter() - start)
        # latency from the small probe's fastest round (noise only ever adds to it),
        # bandwidth from the large probe's typical round, as a collective will see it; the
        # slowest rank sets the pace of a collective
        pick = min if nbytes == small else statistics.median
        elapsed = torch.tensor([pick(samples[1:])], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=topo.global_group)
        step_times.append((elapsed.item() / (2 * (size - 1)), flat.numel() * itemsize / size))
    (t_small, b_small), (t_large, b_large) = step_times
    bandwidth = (b_large - b_small) / max(t_large - t_small, 1e-9)
    latency = max(0.0, t_small - b_small / bandwidth)
    return Tier(latency, bandwidth)
