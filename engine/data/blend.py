"""The blend of a mixture: which source, and which of its samples, each global sample index is.

Megatron's blended-dataset rule: sample `i` goes to the source whose running count is furthest
below its target `p_s · (i+1)` (ties to the lower source). The weights are taken as whole
parts of `RESOLUTION` (`n_s`, summing to `D`); in integers the rule is exact, and its choices
repeat every `D` samples with every source's count back on target (`n_s` per period). So the
counts at any index are a closed form — whole periods plus one precomputed period of `D`
entries — and nothing grows with the run.

A weight change (a live `set`) starts a new segment at the index where it takes effect,
from the counts reached there; the rule then aims at the new weights from that index on. The
segments (index, counts, parts) are the whole state: a few integers per change.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# weights are honoured to 1/RESOLUTION of the whole; one period is at most this many samples
RESOLUTION = 10_000


def parts_of(weights: Sequence[float]) -> tuple[int, ...]:
    """The weights as whole parts of RESOLUTION (at least one each: no source starves)."""
    if not weights or any(not w > 0 for w in weights):
        raise ValueError(f"weights: need positive numbers, got {list(weights)}")
    total = sum(weights)
    parts = [max(1, round(w / total * RESOLUTION)) for w in weights]
    common = math.gcd(*parts)  # the shortest period: equal weights repeat every S samples
    return tuple(n // common for n in parts)


@functools.lru_cache(maxsize=8)
def _period(parts: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """One period of the rule: the source of each offset [D], and every source's count
    before each offset [D, S]."""
    whole, counts = sum(parts), [0] * len(parts)
    deficit = [0] * len(parts)  # parts_s * (j+1) - whole * counts_s, kept up to date
    sources, before = [], []
    for _ in range(whole):
        before.append(counts[:])
        deficit = [d + n for d, n in zip(deficit, parts, strict=True)]
        s = deficit.index(max(deficit))  # the first of the largest: ties to the lower source
        deficit[s] -= whole
        counts[s] += 1
        sources.append(s)
    return torch.tensor(sources), torch.tensor(before)


@dataclass(frozen=True)
class Segment:
    start: int  # the first global sample index under these parts
    counts: tuple[int, ...]  # every source's samples before `start`
    parts: tuple[int, ...]

    def counts_at(self, index: int) -> torch.Tensor:
        periods, offset = divmod(index - self.start, sum(self.parts))
        return (torch.tensor(self.counts) + periods * torch.tensor(self.parts)
                + _period(self.parts)[1][offset])

    def assign(self, first: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The source of every global index in [first, stop) (all in this segment), and the
        sample of that source it is."""
        since = torch.arange(first - self.start, stop - self.start)
        whole = sum(self.parts)
        periods, offsets = since.div(whole, rounding_mode="floor"), since % whole
        sources, before = _period(self.parts)
        source = sources[offsets]
        sample = (torch.tensor(self.counts)[source] + periods * torch.tensor(self.parts)[source]
                  + before[offsets, source])
        return source, sample


class Blend:
    """The mixture's assignment of global sample indices to (source, sample of the source)."""

    def __init__(self, weights: Sequence[float]):
        self.segments = [Segment(0, (0,) * len(weights), parts_of(weights))]

    @property
    def weights(self) -> list[float]:
        """The weights in force in the latest segment, as fractions of the whole."""
        parts = self.segments[-1].parts
        return [n / sum(parts) for n in parts]

    def counts_at(self, index: int) -> list[int]:
        """Every source's samples among global indices [0, index)."""
        segment = next(s for s in reversed(self.segments) if s.start <= index)
        return segment.counts_at(index).tolist()

    def set_weights(self, weights: Sequence[float], at: int) -> None:
        """From global index `at` on, blend at `weights` (segments that start at or after
        `at`, a future a rollback undid, are dropped)."""
        parts = parts_of(weights)
        if len(parts) != len(self.segments[0].parts):
            raise ValueError(f"weights: the mixture has {len(self.segments[0].parts)} "
                             f"sources, got {len(parts)} weights")
        counts = tuple(self.counts_at(at))
        kept = [s for s in self.segments if s.start < at]
        if kept and kept[-1].parts == parts:
            self.segments = kept
        else:
            self.segments = [*kept, Segment(at, counts, parts)]

    def assign(self, first: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The source of every global index in [first, stop), and the sample of that source
        each is (the source's count of samples before it)."""
        sources, samples = [torch.empty(0, dtype=torch.long)], [torch.empty(0, dtype=torch.long)]
        for segment, following in zip(self.segments, [*self.segments[1:], None], strict=True):
            begin = max(first, segment.start)
            end = stop if following is None else min(stop, following.start)
            if begin < end:
                source, sample = segment.assign(begin, end)
                sources.append(source)
                samples.append(sample)
        return torch.cat(sources), torch.cat(samples)

    def state_dict(self) -> list[dict[str, object]]:
        return [{"start": s.start, "counts": list(s.counts), "parts": list(s.parts)}
                for s in self.segments]

    def load_state_dict(self, state: list[dict]) -> None:
        self.segments = [Segment(int(s["start"]), tuple(s["counts"]), tuple(s["parts"]))
                         for s in state]
