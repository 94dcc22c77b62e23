"""Where each rank sits: `nodes` groups of `procs_per_node` ranks, rank = node * P + local.

On one host the "nodes" are just groups of ranks (PaRO's group, HO-Ring's node). The process
groups are one intra-node group per node and one inter-node rail per local rank (the ranks
with the same local index on every node), as in ../shared/specs/paro-horing.md section 6.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Topology:
    nodes: int
    procs_per_node: int
    # filled by init_groups(); every rank holds handles for its own node and rail
    intra: Any = field(default=None, repr=False, compare=False)
    inter: Any = field(default=None, repr=False, compare=False)
    global_group: Any = field(default=None, repr=False, compare=False)
    # second communicators over the same ranks: HO-Ring runs its all-gather stages on these
    # while its reduce-scatter stages use intra/inter, so the pipelined stages never share one
    intra_ag: Any = field(default=None, repr=False, compare=False)
    inter_ag: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.procs_per_node < 1:
            raise ValueError(
                f"a topology needs nodes >= 1 and procs_per_node >= 1, got {self.nodes}x"
                f"{self.procs_per_node}"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.procs_per_node

    def local_rank_of(self, rank: int) -> int:
        return rank % self.procs_per_node

    def rank_of(self, node: int, local_rank: int) -> int:
        return node * self.procs_per_node + local_rank

    def node_ranks(self, node: int) -> list[int]:
        return [self.rank_of(node, j) for j in range(self.procs_per_node)]

    def rail_ranks(self, local_rank: int) -> list[int]:
        return [self.rank_of(k, local_rank) for k in range(self.nodes)]

    @classmethod
    def from_parallel(cls, parallel: Any) -> Topology:
        """From a job spec's `parallel` section (anything with nodes and procs_per_node)."""
        return cls(parallel.nodes, parallel.procs_per_node)

    @classmethod
    def from_env(cls) -> Topology:
        """From a torch.distributed launch: WORLD_SIZE and LOCAL_WORLD_SIZE."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        if world % per_node:
            raise ValueError(f"WORLD_SIZE {world} is not a multiple of LOCAL_WORLD_SIZE {per_node}")
        return cls(world // per_node, per_node)

    def init_groups(self) -> Topology:
        """Create the intra-node and rail groups; every rank must call this, in the same order."""
        import torch.distributed as dist  # here: the shape arithmetic runs without torch

        if not dist.is_initialized():
            raise RuntimeError("torch.distributed must be initialised before init_groups()")
        # every rank gathers every rank's shape first, so a mismatch fails on all ranks alike
        # instead of leaving the ranks that passed waiting in new_group for the others
        shapes: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(shapes, (self.nodes, self.procs_per_node))
        if len(set(shapes)) > 1:
            found = ", ".join(f"rank {r}: {n}x{p}" for r, (n, p) in enumerate(shapes))
            raise ValueError(f"ranks disagree on the topology (nodes x procs_per_node): {found}")
        if dist.get_world_size() != self.world_size:
            raise ValueError(
                f"topology {self.nodes}x{self.procs_per_node} needs {self.world_size} ranks, "
                f"but the process group has {dist.get_world_size()}"
            )
        rank = dist.get_rank()
        self.global_group = dist.group.WORLD
        for name in ("intra", "intra_ag"):
            for node in range(self.nodes):
                group = dist.new_group(self.node_ranks(node))
                if node == self.node_of(rank):
                    setattr(self, name, group)
        for name in ("inter", "inter_ag"):
            for local in range(self.procs_per_node):
                group = dist.new_group(self.rail_ranks(local))
                if local == self.local_rank_of(rank):
                    setattr(self, name, group)
        return self
