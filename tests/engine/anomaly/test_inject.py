"""Fault injection hooks: each fires on its rank and step only, one-shot faults once."""

from __future__ import annotations

import math
import multiprocessing
import threading
import time

import torch

from engine.anomaly import INJECTED_CRASH_EXIT_CODE, FaultInjector
from engine.anomaly.inject import FaultInjection


def test_loss_spike_and_nan_hit_their_rank_and_step_once():
    injections = [FaultInjection("loss_spike", step=3, rank=1, factor=10.0),
                  FaultInjection("nan", step=5, rank=1)]
    other, target = FaultInjector(injections, rank=0), FaultInjector(injections, rank=1)
    loss = torch.tensor(2.0)
    assert other.corrupt_loss(3, loss).item() == 2.0
    assert target.corrupt_loss(2, loss).item() == 2.0
    assert target.corrupt_loss(3, loss).item() == 20.0
    assert target.corrupt_loss(3, loss).item() == 2.0  # a retried step runs clean
    assert math.isnan(target.corrupt_loss(5, loss).item())


def test_marker_files_keep_one_shot_faults_from_firing_again_after_a_restart(tmp_path):
    injections = [FaultInjection("loss_spike", step=3, rank=0)]
    assert FaultInjector(injections, 0, tmp_path).corrupt_loss(3, 1.0) == 10.0
    assert FaultInjector(injections, 0, tmp_path).corrupt_loss(3, 1.0) == 1.0


def test_slow_rank_stretches_the_op_by_its_factor_from_its_step_on():
    injector = FaultInjector([FaultInjection("slow_rank", step=2, rank=0, factor=3.0)], 0)

    def timed(step: int) -> float:
        start = time.perf_counter()
        with injector.slowdown(step):
            time.sleep(0.05)
        return time.perf_counter() - start

    assert timed(1) < 0.1
    assert timed(2) >= 0.15 and timed(9) >= 0.15


def test_slow_rank_with_an_until_step_runs_at_full_speed_after_it():
    injector = FaultInjector([FaultInjection("slow_rank", step=2, rank=0, factor=3.0, until=3)], 0)

    def timed(step: int) -> float:
        start = time.perf_counter()
        with injector.slowdown(step):
            time.sleep(0.05)
        return time.perf_counter() - start

    assert timed(3) >= 0.15 and timed(4) < 0.1


def test_hang_blocks_the_calling_thread():
    injector = FaultInjector([FaultInjection("hang", step=4, rank=0)], 0)
    injector.hang_point(3)
    thread = threading.Thread(target=injector.hang_point, args=(4,), daemon=True)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()


def crash_at(step: int) -> None:
    injector = FaultInjector([FaultInjection("crash", step=2, rank=0)], 0)
    for s in range(1, step + 1):
        injector.crash_point(s)


def test_crash_exits_the_process_at_its_step():
    # spawned, not forked: the test process may hold threads of earlier tests (the platform's
    # channel layer, the ingest's pool), and a fork copies their locks held, hanging the child
    ctx = multiprocessing.get_context("spawn")
    survivor, crasher = ctx.Process(target=crash_at, args=(1,)), ctx.Process(
        target=crash_at, args=(3,))
    for p in (survivor, crasher):
        p.start()
        p.join(30)
    assert survivor.exitcode == 0
    assert crasher.exitcode == INJECTED_CRASH_EXIT_CODE


def test_a_bad_batch_is_scrambled_whenever_its_data_comes_again_and_after_a_restart(tmp_path):
    injections = [FaultInjection("bad_batch", step=4, rank=1)]
    labels = torch.tensor([[10, 200, 3]])
    target = FaultInjector(injections, rank=1, state_dir=tmp_path)
    assert torch.equal(target.corrupt_batch(3, 8, labels), labels)
    bad = target.corrupt_batch(4, 12, labels)
    assert bad.tolist() == [[138, 72, 131]]
    assert torch.equal(target.corrupt_batch(4, 12, labels), bad)  # the same data: again
    assert torch.equal(target.corrupt_batch(4, 16, labels), labels)  # the step's next data
    assert torch.equal(FaultInjector(injections, 0).corrupt_batch(4, 12, labels), labels)
    restarted = FaultInjector(injections, rank=1, state_dir=tmp_path)
    assert torch.equal(restarted.corrupt_batch(9, 12, labels), bad)
