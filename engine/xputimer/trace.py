"""Chrome-trace (Perfetto, chrome://tracing) export of the recent timeline of every rank.

One process per rank, one thread per stream and nesting lane: nested and overlapping ops are
spread over lanes so that the events of any one thread never overlap (a child op sits one
lane below its parent). Timestamps are microseconds from the earliest event of the trace,
taken from wall-clock nanoseconds so ranks on one host line up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist

from engine.xputimer.timer import KINDS, STREAM_ASYNC, STREAM_HOST, OpTimer

_STREAM_NAMES = {STREAM_HOST: "host", STREAM_ASYNC: "async collectives"}
_LANES_PER_STREAM = 100


def rank_timeline(timer: OpTimer, steps: set[int] | None = None) -> dict[str, Any]:
    """This rank's ring contents (optionally only `steps`) as plain lists, ready to gather."""
    records = timer.ring.snapshot(steps)
    return {"rank": timer.rank, "names": list(timer.names),
            **{name: col.tolist() for name, col in records.items()}}


def chrome_trace(timelines: list[dict[str, Any]]) -> dict[str, Any]:
    """Build one Chrome trace from per-rank timelines (`rank_timeline` results)."""
    starts = [min(t["t_start_ns"]) for t in timelines if t["t_start_ns"]]
    origin = min(starts) if starts else 0
    events: list[dict[str, Any]] = []
    for tl in timelines:
        rank = tl["rank"]
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        # parents first: by start, then longest first
        order = np.lexsort((-np.asarray(tl["dur_ns"], np.int64),
                            np.asarray(tl["t_start_ns"], np.int64)))
        lane_ends: dict[int, list[int]] = {}
        threads: set[int] = set()
        for i in order.tolist():
            start, dur, stream = tl["t_start_ns"][i], tl["dur_ns"][i], tl["stream"][i]
            ends = lane_ends.setdefault(stream, [])
            lane = next((k for k, end in enumerate(ends) if end < start), len(ends))
            if lane == len(ends):
                ends.append(start + dur)
            else:
                ends[lane] = start + dur
            tid = stream * _LANES_PER_STREAM + lane
            threads.add(tid)
            events.append({
                "ph": "X", "pid": rank, "tid": tid, "name": tl["names"][tl["op_code"][i]],
                "cat": KINDS[tl["kind"][i]], "ts": (start - origin) / 1e3, "dur": dur / 1e3,
                "args": {"step": tl["step"][i], "seq": tl["seq"][i], "work": tl["work"][i]},
            })
        for tid in sorted(threads):
            stream, lane = divmod(tid, _LANES_PER_STREAM)
            name = _STREAM_NAMES.get(stream, f"cuda stream {stream - 2}")
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                           "args": {"name": name if lane == 0 else f"{name} / depth {lane}"}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(timer: OpTimer, path: Path, steps: set[int] | None = None,
                group: Any = None) -> Path | None:
    """Gather every rank's timeline to rank 0 and write one trace JSON; collective when
    torch.distributed is initialised (all ranks of `group` call it). Returns the path on the
    writing rank, None elsewhere."""
    mine = rank_timeline(timer, steps)
    if dist.is_available() and dist.is_initialized():
        gathered: list[Any] | None = (
            [None] * dist.get_world_size(group) if dist.get_rank(group) == 0 else None)
        dst = dist.get_global_rank(group, 0) if group is not None else 0
        dist.gather_object(mine, gathered, dst=dst, group=group)
        if gathered is None:
            return None
        timelines = gathered
    else:
        timelines = [mine]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(chrome_trace(timelines), separators=(",", ":")))
    tmp.replace(path)
    return path
