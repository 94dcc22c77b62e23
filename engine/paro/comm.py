"""The collectives PaRO is built from, on the intra-group and rail groups, with counters.

Intra-group and rail collectives are single torch.distributed calls on `topo.intra` /
`topo.inter`. Global ones are two-level in the nested layout (spec section 8): reduce-scatter
= intra RS then rail RS, all-gather = rail AG then intra AG, all-reduce = intra RS, rail AR,
intra AG; with collective "ring", "hier" or "horing" they run as engine.horing's algorithms
instead (layout "nested"), with "native" as the composition above on torch.distributed.

Counters attribute every byte to the tier it crosses, the way the spec's schedule table does:
one rank sends (n-1)/n * S in a ring reduce-scatter or all-gather of S bytes among n ranks
(S = the unsharded size) and twice that in an all-reduce; a global collective counts its
intra part and its rail part (for "ring", a flat ring, that split is nominal). A group of one
rank sends nothing and is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

import engine.horing
from engine.contract import COLLECTIVES
from engine.horing.topology import Topology
from engine.xputimer import OpTimer


@dataclass
class CommStats:
    intra_bytes: int = 0
    inter_bytes: int = 0
    intra_calls: int = 0
    inter_calls: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class Comm:
    """`timer` times every collective as op "<collective>.<group>" with its bytes, group and
    algorithm (XPUTimer's collective ops); without one nothing is timed."""

    def __init__(self, topo: Topology, collective: str = "native", timer: OpTimer | None = None):
        if collective not in COLLECTIVES:
            raise ValueError(
                f"collective must be one of {', '.join(COLLECTIVES)}; got {collective!r}"
            )
        if topo.intra is None or topo.inter is None:
            raise ValueError("topo: call Topology.init_groups() on every rank before sharding")
        self.topo = topo
        self.collective = collective
        self.stats = CommStats()
        self._buffers: dict[tuple, torch.Tensor] = {}
        self.timer = timer if timer is not None else OpTimer(enabled=False, ring_capacity=1)

    def reset(self) -> None:
        self.stats = CommStats()

    # ---- one tier: "intra" (this rank's group) or "inter" (this rank's rail) -----------

    def reduce_scatter(self, tier: str, full: torch.Tensor) -> torch.Tensor:
        """Sum `full` over the tier's group; return this rank's 1/n slice (in group order). On
        gloo the slice is a view into a buffer that the next reduce-scatter on the same tier
        overwrites: use it before then. A group of one returns `full` itself."""
        n = self._members(tier)
        if not self._count(tier, _nbytes(full), 1):
            return full
        with self._timed("reduce_scatter", tier, full):
            if dist.get_backend() == "gloo":
                return self._ring_reduce_scatter(tier, full)
            out = full.new_empty(full.numel() // n)
            dist.reduce_scatter_single(out, full, group=self._group(tier))
            return out

    def all_gather(
        self, tier: str, shard: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Concatenate the group's shards (in group order) into `out` (allocated if None).
        `shard` may be this rank's own slice of `out`: the gather is then in place."""
        if out is None:
            out = shard.new_empty(shard.numel() * self._members(tier))
        if not self._count(tier, _nbytes(out), 1):
            out.copy_(shard)
            return out
        with self._timed("all_gather", tier, out):
            if dist.get_backend() == "gloo":
                self._ring_all_gather(tier, shard, out)
            else:
                dist.all_gather_single(out, shard, group=self._group(tier))
        return out

    def all_reduce(self, tier: str, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the tier's group, in place."""
        if self._count(tier, _nbytes(tensor), 2):
            with self._timed("all_reduce", tier, tensor):
                dist.all_reduce(tensor, group=self._group(tier))
        return tensor

    # ---- global, in the nested layout ---------------------------------------------------

    def global_reduce_scatter(self, full: torch.Tensor) -> torch.Tensor:
        """Sum over all ranks; return this rank's global block j*R + k."""
        if self.collective == "native":
            return self.reduce_scatter("inter", self.reduce_scatter("intra", full))
        self._count_global(full)
        out = full.new_empty(full.numel() // self.topo.world_size)
        with self._timed("reduce_scatter", "global", full):
            engine.horing.reduce_scatter(out, full, self.topo, self.collective, layout="nested")
        return out

    def global_all_gather(self, block: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Every rank's global block, in the nested layout, into `out`; `block` may be this
        rank's own block of `out` (in place)."""
        if self.collective == "native":
            # the rail's blocks make up this rank's intra shard: gather them in its place
            mine = out.view(self.topo.procs_per_node, -1)[self.topo.local_rank_of(dist.get_rank())]
            return self.all_gather("intra", self.all_gather("inter", block, out=mine), out=out)
        self._count_global(out)
        with self._timed("all_gather", "global", out):
            engine.horing.all_gather(out, block, self.topo, self.collective, layout="nested")
        return out

    def global_all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over all ranks, in place."""
        if self.collective == "native":
            shard = self.all_reduce("inter", self.reduce_scatter("intra", tensor))
            return self.all_gather("intra", shard, out=tensor)
        self._count_global(tensor, all_reduce=True)
        with self._timed("all_reduce", "global", tensor):
            engine.horing.all_reduce(tensor, self.topo, self.collective)
        return tensor

    # gloo's reduce_scatter is an all-reduce underneath (twice the bytes on the NIC, measured
    # by bench/paro.py) and its all-gather runs ~10x below the link rate on large buffers, so
    # on gloo both are rings of point-to-point sends.

    def _ring_reduce_scatter(self, tier: str, full: torch.Tensor) -> torch.Tensor:
        """Step s: position i passes its partial sum of chunk i-s-1 on and adds chunk i-s-2.

        `full` is read in place: each chunk this position receives is written once, as its own
        part plus the partial sum that arrived, into a buffer this tier reuses (fresh buffers
        of many MB cost a page fault per 4 KiB, which on a CPU host shared by the ranks took
        as long as the transfer). The result is a view into that buffer, valid until the next
        reduce-scatter on this tier."""
        ring, pos = self._ring(tier)
        n = len(ring)
        chunks = full.view(n, -1)
        partial = self._buffer(f"reduce_scatter.{tier}", full).view(n, -1)
        incoming = self._buffer(f"incoming.{tier}", chunks[0])
        for step in range(n - 1):
            # the chunk sent at step 0 is untouched, the later ones arrived the step before
            source = chunks if step == 0 else partial
            self._shift(tier, ring, pos, source[(pos - step - 1) % n], incoming)
            into = (pos - step - 2) % n
            torch.add(chunks[into], incoming, out=partial[into])
        return partial[pos]

    def _buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """A reusable 1-D buffer with `like`'s numel, dtype and device."""
        key = (name, like.dtype, like.device)
        held = self._buffers.get(key)
        if held is None or held.numel() < like.numel():
            held = self._buffers[key] = like.new_empty(like.numel())
        return held[: like.numel()]

    def _ring_all_gather(self, tier: str, shard: torch.Tensor, out: torch.Tensor) -> None:
        """Step s: position i passes chunk i-s on and receives chunk i-s-1."""
        ring, pos = self._ring(tier)
        n = len(ring)
        chunks = out.view(n, -1)
        chunks[pos].copy_(shard)
        for step in range(n - 1):
            self._shift(tier, ring, pos, chunks[(pos - step) % n], chunks[(pos - step - 1) % n])

    def _ring(self, tier: str) -> tuple[list[int], int]:
        rank = dist.get_rank()
        if tier == "intra":
            ring = self.topo.node_ranks(self.topo.node_of(rank))
        else:
            ring = self.topo.rail_ranks(self.topo.local_rank_of(rank))
        return ring, ring.index(rank)

    def _shift(self, tier: str, ring: list[int], pos: int, send: torch.Tensor, recv: torch.Tensor):
        """Send to the next position and receive from the previous one, concurrently."""
        group, n = self._group(tier), len(ring)
        ops = [
            dist.P2POp(dist.isend, send, ring[(pos + 1) % n], group),
            dist.P2POp(dist.irecv, recv, ring[(pos - 1) % n], group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    # ---- timing and counting ------------------------------------------------------------

    def _timed(self, collective: str, group: str, full: torch.Tensor):
        """A span for one collective over `full` (the unsharded tensor) on `group`: intra,
        inter (this rank's rail) or global. On gloo a one-tier reduce-scatter or all-gather is
        our point-to-point ring; on NCCL (and for all-reduce) torch.distributed's own."""
        if group == "global":
            algo, members = self.collective, self.topo.world_size
        else:
            members = self._members(group)
            ours = collective != "all_reduce" and dist.get_backend() == "gloo"
            algo = "ring" if ours else "native"
        return self.timer.op(f"{collective}.{group}", kind="collective", nbytes=_nbytes(full),
                             group=group, algo=algo, collective=collective, group_size=members)


    def _count_global(self, full: torch.Tensor, all_reduce: bool = False) -> None:
        """As the native composition: an all-reduce is intra RS, rail AR, intra AG."""
        for _ in range(2 if all_reduce else 1):
            self._count("intra", _nbytes(full), 1)
        self._count("inter", _nbytes(full) // self.topo.procs_per_node, 2 if all_reduce else 1)

    def _count(self, tier: str, unsharded_bytes: int, factor: int) -> bool:
        members = self._members(tier)
        if members == 1:
            return False
        sent = factor * (members - 1) * unsharded_bytes // members
        if tier == "intra":
            self.stats.intra_bytes += sent
            self.stats.intra_calls += 1
        else:
            self.stats.inter_bytes += sent
            self.stats.inter_calls += 1
        return True

    def _group(self, tier: str):
        return self.topo.intra if tier == "intra" else self.topo.inter

    def _members(self, tier: str) -> int:
        return self.topo.procs_per_node if tier == "intra" else self.topo.nodes


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
