"""Hang watchdog: fires on an op older than its timeout, names it, dumps all stacks."""

from __future__ import annotations

import re
import time

import pytest

from engine.anomaly import Anomaly
from engine.xputimer import HangWatchdog, OpTimer


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
