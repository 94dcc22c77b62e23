"""The timeline ring: a struct-of-arrays record per timed op, overwrite-oldest (spec §3).

One writer (the training thread) and readers that copy a window out of it. The write index
is monotonic, so a reader knows how many records were overwritten since it last looked.
2^16 slots take about 3 MB.
"""

from __future__ import annotations

import numpy as np

FIELDS = {
    "op_code": np.int32,
    "t_start_ns": np.int64,  # wall clock
    "dur_ns": np.int64,
    "work": np.int64,  # FLOPs for matmuls, bytes for collectives
    "seq": np.int64,  # per-op call counter: (op_code, seq) is the same instance on all ranks
    "stream": np.int16,
    "step": np.int32,
    "kind": np.int16,
}


class TimelineRing:
    def __init__(self, capacity: int = 1 << 16):
        if capacity < 1:
            raise ValueError(f"ring_capacity: must be at least 1, got {capacity}")
        self.capacity = capacity
        self.written = 0  # monotonic write index
        self.columns = {name: np.zeros(capacity, dtype) for name, dtype in FIELDS.items()}
        # the hot path writes through these bound views, not through the dict
        c = self.columns
        self._cols = (c["op_code"], c["t_start_ns"], c["dur_ns"], c["work"], c["seq"],
                      c["stream"], c["step"], c["kind"])

    def append(self, op_code: int, t_start_ns: int, dur_ns: int, work: int, seq: int,
               stream: int, step: int, kind: int) -> None:
        i = self.written % self.capacity
        code, start, dur, wk, sq, st, sp, kd = self._cols
        code[i] = op_code
        start[i] = t_start_ns
        dur[i] = dur_ns
        wk[i] = work
        sq[i] = seq
        st[i] = stream
        sp[i] = step
        kd[i] = kind
        self.written += 1

    def snapshot(self, steps: set[int] | None = None) -> dict[str, np.ndarray]:
        """A copy of the records still held, oldest first, optionally only of `steps`."""
        n = min(self.written, self.capacity)
        order = (np.arange(self.written - n, self.written) % self.capacity)
        out = {name: col[order].copy() for name, col in self.columns.items()}
        if steps is not None:
            keep = np.isin(out["step"], np.fromiter(steps, np.int32, len(steps)))
            out = {name: col[keep] for name, col in out.items()}
        return out

    @property
    def size_bytes(self) -> int:
        return sum(col.nbytes for col in self.columns.values())
