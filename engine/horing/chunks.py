"""How the collectives cut a buffer into ranges and pipeline chunks: plain arithmetic that the
cost model (and through it the platform's planner) prices without importing torch."""

from __future__ import annotations

import math

Range = tuple[int, int]  # [start, stop) in the flat buffer
Piece = list[Range]  # what one ring position owns: one or more ranges

# HO-Ring pipeline pieces of 12 MiB: every piece costs each stage a few cross-process
# hand-offs and a wait on its ring partners, which on a CPU host shared by many ranks take
# milliseconds, so larger pieces pay less of that; the first and last chunks are cut into
# quarters, so the unoverlapped first intra reduce-scatter and last intra all-gather stay
# short (measured on the emulated 2x2 cluster, 32 MB all-reduce, 13 interleaved rounds:
# 4 MiB 0.173 s, 8 MiB 0.171 s, 12 MiB 0.165 s)
DEFAULT_CHUNK_BYTES = 12 << 20


def split(start: int, stop: int, parts: int) -> list[Range]:
    """`parts` near-equal consecutive ranges covering [start, stop)."""
    size, extra = divmod(stop - start, parts)
    bounds = [start + i * size + min(i, extra) for i in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def pipeline_split(start: int, stop: int, count: int) -> list[Range]:
    """`count` near-equal pieces of [start, stop), the first and the last cut again into
    quarters: the pipeline fills and drains on a quarter piece, so the intra reduce-scatter
    before the first transfer and the intra all-gather after the last one stay short."""
    pieces = split(start, stop, count)
    if count < 3:
        return pieces
    return split(*pieces[0], 4) + pieces[1:-1] + split(*pieces[-1], 4)


def chunk_count(algo: str, nbytes: int, smallest_piece: int, chunk_bytes: int) -> int:
    """How many pipeline chunks a collective of `nbytes` runs in (HO-Ring only)."""
    if algo != "horing":
        return 1
    return max(1, min(math.ceil(nbytes / chunk_bytes), smallest_piece))
