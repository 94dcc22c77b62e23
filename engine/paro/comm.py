"""The five collectives PaRO is built from, on the intra-group and rail groups, with counters.

Every global collective of the spec's schedule is composed from these (a global reduce-scatter
is an intra reduce-scatter then a rail reduce-scatter; a global all-gather the reverse; a
global all-reduce is intra RS, rail AR, intra AG), so every byte is attributed to the tier it
crosses. Bytes are what one rank sends in a ring over n members: (n-1)/n * S for a
reduce-scatter or all-gather of S bytes (S = the unsharded size), twice that for an
all-reduce (../shared/specs/paro-horing.md section 5). A group of one rank sends nothing and
is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.horing.topology import Topology

COLLECTIVES = ("native", "ring", "hier", "horing")


@dataclass
class CommStats:
    intra_bytes: int = 0
    inter_bytes: int = 0
    intra_calls: int = 0
    inter_calls: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class Comm:
    def __init__(self, topo: Topology, collective: str = "native"):
        if collective not in COLLECTIVES:
            raise ValueError(
                f"collective must be one of {', '.join(COLLECTIVES)}; got {collective!r}"
            )
        if topo.intra is None or topo.inter is None:
            raise ValueError("topo: call Topology.init_groups() on every rank before sharding")
        self.topo = topo
        self.collective = collective
        self.stats = CommStats()

    def reset(self) -> None:
        self.stats = CommStats()

    def _count(self, tier: str, members: int, unsharded: torch.Tensor, factor: int) -> bool:
        if members == 1:
            return False
        sent = factor * (members - 1) * unsharded.numel() * unsharded.element_size() // members
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

    def reduce_scatter(self, tier: str, full: torch.Tensor) -> torch.Tensor:
        """Sum `full` over the tier's group; return this rank's 1/n slice (in group order)."""
        n = self._members(tier)
        if not self._count(tier, n, full, 1):
            return full.clone()
        out = full.new_empty(full.numel() // n)
        dist.reduce_scatter_single(out, full, group=self._group(tier))
        return out

    def all_gather(
        self, tier: str, shard: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Concatenate the group's shards (in group order) into `out` (allocated if None)."""
        n = self._members(tier)
        if out is None:
            out = shard.new_empty(shard.numel() * n)
        if not self._count(tier, n, out, 1):
            out.copy_(shard)
            return out
        dist.all_gather_single(out, shard, group=self._group(tier))
        return out

    def all_reduce(self, tier: str, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the tier's group, in place."""
        if self._count(tier, self._members(tier), tensor, 2):
            dist.all_reduce(tensor, group=self._group(tier))
        return tensor
