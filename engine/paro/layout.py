"""The nested shard layout of one flat buffer (../shared/specs/paro-horing.md section 6).

A flat buffer of `numel` elements is zero-padded to a multiple of the world size N and split
into N equal blocks. Rank (k, j) -- group k, local index j -- owns global block j*R + k, and its
intra-group shard is blocks j*R .. j*R + R-1. The global block therefore sits inside the intra
shard, so every I<->G conversion is a collective among the R ranks of rail j, and the ordering
of blocks (by rail, then group) matches torch's rank order in both the intra group (ordered by
j) and the rail group (ordered by k).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.paro.strategy import Level


@dataclass(frozen=True)
class ShardLayout:
    numel: int  # real elements, without padding
    groups: int  # R
    group_size: int  # g

    @property
    def world_size(self) -> int:
        return self.groups * self.group_size

    @property
    def block(self) -> int:
        return -(-self.numel // self.world_size)

    @property
    def padded(self) -> int:
        return self.block * self.world_size

    def size(self, level: Level) -> int:
        """Elements a rank holds for a buffer partitioned at `level`."""
        return {"N": self.padded, "I": self.groups * self.block, "G": self.block}[level]

    def start(self, level: Level, group: int, local: int) -> int:
        """Padded-buffer offset of the range rank (group, local) holds at `level`."""
        return {
            "N": 0,
            "I": local * self.groups * self.block,
            "G": (local * self.groups + group) * self.block,
        }[level]

    def real_range(self, level: Level, group: int, local: int) -> tuple[int, int]:
        """The [start, end) of that range clipped to the real (unpadded) elements."""
        start = min(self.start(level, group, local), self.numel)
        return start, min(start + self.size(level), self.numel)
