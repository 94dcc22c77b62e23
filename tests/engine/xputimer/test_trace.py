"""Chrome-trace export: valid JSON, one process per rank, events of a thread never overlap."""

from __future__ import annotations

import json
from collections import defaultdict

import torch

from engine.xputimer import OpTimer, chrome_trace, rank_timeline, write_trace

torch.set_num_threads(1)


def run_steps(timer: OpTimer, steps: range) -> None:
    for step in steps:
        with timer.op("forward"):
            with timer.op("attention", kind="matmul", flops=10):
                pass
            with timer.op("experts", kind="matmul", flops=20):
                pass
        future = torch.futures.Future()
        with timer.op("grad_sync", kind="collective", nbytes=8, group="global") as span:
            span.finish_when(future)
        with timer.op("optimizer", kind="host"):
            future.set_result(None)  # the async op overlaps a host op
        timer.step_end(step)


def assert_no_overlap_per_thread(trace: dict) -> None:
    by_thread = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_thread[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    assert by_thread
    for spans in by_thread.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert end <= start


def test_trace_has_one_process_per_rank_and_no_overlap_within_a_thread(tmp_path):
    timers = [OpTimer(rank, sample_every=1) for rank in range(3)]
    for timer in timers:
        run_steps(timer, range(1, 4))
    trace = json.loads(json.dumps(chrome_trace([rank_timeline(t) for t in timers])))
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(ops) == 3 * 3 * 5
    assert {e["name"] for e in ops} == {"forward", "attention", "experts", "grad_sync",
                                        "optimizer"}
    assert min(e["ts"] for e in ops) == 0
    assert_no_overlap_per_thread(trace)
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"host", "host / depth 1", "async collectives"} <= threads


def test_write_trace_without_distributed_and_step_filter(tmp_path):
    timer = OpTimer(sample_every=1)
    run_steps(timer, range(1, 6))
    path = write_trace(timer, tmp_path / "trace.json", steps={4})
    trace = json.loads(path.read_text())
    steps = {e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert steps == {4}


def test_trace_stays_under_2_mb_per_rank_per_sampled_step(tmp_path):
    timer = OpTimer(sample_every=1)
    for step in range(1, 3):  # a step of 2,000 timed ops: well above a tiny model's count
        for i in range(2000):
            with timer.op(f"layer{i % 20}.op{i % 7}", kind="matmul", flops=i):
                pass
        timer.step_end(step)
    path = write_trace(timer, tmp_path / "trace.json")
    assert path.stat().st_size / 2 < 2e6
