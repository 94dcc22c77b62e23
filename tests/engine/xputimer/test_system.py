"""Per-rank system metrics: every step event of a 2-rank gloo run carries each rank's CPU % and
RSS, gathered with the step's timings (no collective of their own)."""

import os

import psutil

from engine.runtime.events import read_events
from engine.runtime.launch import RunTarget, launch
from engine.runtime.spec import parse_spec

RANKS = 2


def test_each_step_event_carries_every_ranks_cpu_percent_and_rss(tmp_path):
    spec = parse_spec({
        "name": "system", "model": {"preset": "nano"},
        "parallel": {"nodes": 1, "procs_per_node": RANKS},
        "train": {"steps": 4, "micro_batch": 1, "seq_len": 32, "eval_every": 0, "threads": 1},
        "checkpoint": {"every": 0},
    })
    target = RunTarget(run_dir=tmp_path / "run", events_path=tmp_path / "events.jsonl",
                       job="system")
    assert launch(spec, target) == 0

    steps = [e for e in read_events(target.events_path) if e["type"] == "step"]
    assert len(steps) == 4
    cores = os.cpu_count() or 1
    machine = psutil.virtual_memory().total
    for event in steps:
        system = event["system"]
        # on CPU only what a CPU has: no GPU series
        assert set(system) == {"cpu_percent", "rss_bytes"}
        assert len(system["cpu_percent"]) == len(system["rss_bytes"]) == RANKS
        assert all(0 <= cpu <= 100 * cores for cpu in system["cpu_percent"])
        assert all(0 < rss < machine for rss in system["rss_bytes"])
        # the largest rank's RSS is the step's `memory` figure (measured at the same moment)
        assert max(system["rss_bytes"]) == event["memory"]["rss_bytes"]
    # the ranks are separate processes, each measured on its own: a rank that trains uses CPU
    assert all(max(e["system"]["cpu_percent"][r] for e in steps[1:]) > 0 for r in range(RANKS))
