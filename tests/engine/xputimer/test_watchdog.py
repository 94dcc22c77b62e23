"""Hang watchdog: fires on an op older than its timeout, names it, dumps all stacks; across
real gloo ranks, the hung rank and the ranks waiting for it in a collective are each named."""

from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest
import torch
import torch.distributed as dist

from engine.anomaly import Anomaly, FaultInjector
from engine.runtime.spec import FaultInjection
from engine.xputimer import HangWatchdog, OpTimer
from tests.engine.ranks import run_ranks


def wait_for(fired: list, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not fired and time.monotonic() < deadline:
        time.sleep(0.02)


def test_fires_on_the_op_in_flight_and_dumps_every_threads_stack(tmp_path):
    timer = OpTimer(rank=3)
    fired: list[Anomaly] = []
    dog = HangWatchdog(timer, timeout_s=0.3, dump_dir=tmp_path, on_hang=fired.append).start()
    try:
        with timer.op("grad_sync", kind="collective", group="inter", algo="horing"):
            wait_for(fired)
    finally:
        dog.stop()
    (hang,) = fired
    assert (hang.kind, hang.rank, hang.severity) == ("hang", 3, "critical")
    assert hang.evidence["op"] == "grad_sync"
    assert hang.evidence["group"] == "inter" and hang.evidence["seq"] == 1
    assert hang.evidence["age_s"] > hang.evidence["timeout_s"] == 0.3
    dump = (tmp_path / "hang-rank3-step1.txt").read_text()
    assert hang.evidence["stack_dump"].endswith("hang-rank3-step1.txt")
    assert "wait_for" in dump  # the blocked training thread's frame
    assert len(re.findall(r"^(Current thread|Thread) 0x", dump, re.M)) >= 2  # and the others


def test_fires_once_per_stuck_op_and_not_for_ops_within_the_timeout(tmp_path):
    timer = OpTimer()
    fired: list[Anomaly] = []
    dog = HangWatchdog(timer, timeout_s=0.4, dump_dir=tmp_path, on_hang=fired.append,
                       poll_s=0.02).start()
    try:
        for step in range(1, 4):
            with timer.op("forward"):
                time.sleep(0.1)
            timer.step_end(step)
        assert fired == []
        with timer.op("forward"):
            time.sleep(1.0)  # several polls past the timeout
    finally:
        dog.stop()
    assert [a.evidence["op"] for a in fired] == ["forward"]


def test_an_outer_op_whose_inner_ops_progress_is_not_a_hang(tmp_path):
    timer = OpTimer()
    fired: list[Anomaly] = []
    dog = HangWatchdog(timer, timeout_s=0.3, dump_dir=tmp_path, on_hang=fired.append,
                       poll_s=0.02).start()
    try:
        with timer.op("backward"):
            for _ in range(8):
                with timer.op("grad_sync", kind="collective", group="global"):
                    time.sleep(0.1)
            assert fired == []
            time.sleep(0.6)  # now nothing inside moves
    finally:
        dog.stop()
    assert [a.evidence["op"] for a in fired] == ["backward"]


def test_a_long_op_that_has_returned_is_progress_not_a_second_hang(tmp_path):
    timer = OpTimer()
    fired: list[Anomaly] = []
    dog = HangWatchdog(timer, timeout_s=0.2, dump_dir=tmp_path, on_hang=fired.append)
    with timer.op("forward"):
        time.sleep(0.3)
        assert dog.check().evidence["op"] == "forward"
    assert dog.check() is None  # it returned just now: the rank is moving again
    time.sleep(0.3)
    assert dog.check().evidence["op"] is None  # and stuck after it, it is caught
    assert [a.evidence["op"] for a in fired] == ["forward", None]


def test_a_rank_stuck_between_timed_ops_is_caught_by_step_progress(tmp_path):
    timer = OpTimer()
    with timer.op("data", kind="data"):
        pass
    fired: list[Anomaly] = []
    dog = HangWatchdog(timer, timeout_s=0.3, dump_dir=tmp_path, on_hang=fired.append).start()
    try:
        wait_for(fired)
    finally:
        dog.stop()
    assert fired[0].evidence["op"] is None and fired[0].evidence["last_op"] == "data"


def test_paused_watchdog_stays_quiet(tmp_path):
    timer = OpTimer()
    fired: list[Anomaly] = []
    dog = HangWatchdog(timer, timeout_s=0.2, dump_dir=tmp_path, on_hang=fired.append).start()
    dog.pause()
    try:
        time.sleep(0.5)
        assert fired == []
        dog.resume()  # the pause does not count as a hang
        time.sleep(0.05)
        assert fired == []
    finally:
        dog.stop()


def test_timeout_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="hang_timeout_s"):
        HangWatchdog(OpTimer(), timeout_s=0, dump_dir=tmp_path, on_hang=print)


HANG_RANK, HANG_STEP, WORLD = 1, 3, 3


def hang_rank_main(out: str) -> None:
    """Rank 1 hangs inside its forward at step 3; the others block in the all-reduce."""
    rank = dist.get_rank()
    timer = OpTimer(rank)
    injector = FaultInjector([FaultInjection("hang", step=HANG_STEP, rank=HANG_RANK)], rank)

    reported = threading.Event()

    def on_hang(anomaly: Anomaly) -> None:
        with open(f"{out}/hang-{rank}.json", "w") as f:
            json.dump({"rank": anomaly.rank, "step": anomaly.step, **anomaly.evidence}, f)
        reported.set()
        time.sleep(3)  # let every rank's watchdog report before the first one leaves
        os._exit(0)  # a supervisor would restart the ranks here

    HangWatchdog(timer, timeout_s=1.0, dump_dir=out, on_hang=on_hang, poll_s=0.1).start()
    grads = torch.ones(1024)
    for step in range(1, 10):
        with timer.op("forward"):
            injector.hang_point(step)
        try:
            with timer.op("grad_all_reduce", kind="collective", group="global", nbytes=4096,
                          collective="all_reduce", group_size=WORLD):
                dist.all_reduce(grads)
        except RuntimeError:
            # A peer that reported first has left, breaking this collective; the watchdog
            # thread ends this rank too once its own report is written.
            if not reported.is_set():
                raise
            time.sleep(60)
        timer.step_end(step)


def test_a_hung_rank_and_the_ranks_waiting_for_it_are_each_named(tmp_path):
    run_ranks(hang_rank_main, str(tmp_path), procs_per_node=WORLD, timeout_s=60)
    reports = {r: json.loads((tmp_path / f"hang-{r}.json").read_text()) for r in range(WORLD)}
    assert reports[HANG_RANK]["op"] == "forward"
    for rank in set(range(WORLD)) - {HANG_RANK}:
        assert reports[rank]["op"] == "grad_all_reduce" and reports[rank]["group"] == "global"
        assert reports[rank]["seq"] == HANG_STEP
    assert all(r["step"] == HANG_STEP and 1.0 < r["age_s"] < 1.0 + 5 for r in reports.values())
    assert (tmp_path / f"hang-rank{HANG_RANK}-step{HANG_STEP}.txt").read_text().count(
        "hang_point") == 1
