"""Real torch.distributed (gloo) ranks on this host, for the engine's multi-rank tests.

`run_ranks(fn, *args, ...)` starts `nodes x procs_per_node` processes, each with the
environment a torch.distributed launch gives (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; so `Topology.from_env()` sees the nodes), a gloo process group and
one intra-op thread; calls `fn(*args)` in every rank and returns what each rank returned, in
rank order. A rank that raises fails the test with its traceback; ranks still running after
`timeout_s` fail it as hung. Either way the other ranks are killed, so nothing outlives the
test.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
import torch.distributed as dist

from engine.ports import free_port

T = TypeVar("T")

# The ranks fork from a server process that has imported torch once: they inherit none of the
# test process's threads and locks (as with spawn) and skip importing torch again (unlike
# spawn). They see the environment the server started with, plus the variables set below.
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["torch", "torch.distributed"])


def _rank_main(fn: Callable[..., Any], args: tuple, env: dict[str, str], out: str) -> None:
    os.environ.update(env)
    rank = env["RANK"]
    torch.set_num_threads(1)  # the ranks share this host's cores
    try:
        dist.init_process_group("gloo")
        result = fn(*args)
        dist.destroy_process_group()
    except BaseException:
        Path(out, f"rank{rank}.error").write_text(traceback.format_exc())
        raise SystemExit(1) from None
    with open(Path(out, f"rank{rank}.result"), "wb") as f:
        pickle.dump(result, f)


def run_ranks(
    fn: Callable[..., T],
    *args: Any,
    procs_per_node: int,
    nodes: int = 1,
    timeout_s: float,
) -> list[T | None]:
    """`fn(*args)` on `nodes * procs_per_node` gloo ranks (fn and args picklable: fn defined at
    a module's top level); each rank's return value, in rank order. A rank that ends its own
    process with status 0 (as a watchdog standing in for a supervisor's restart does) gives
    None."""
    world = nodes * procs_per_node
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                  "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(procs_per_node)}
    with tempfile.TemporaryDirectory(prefix="ranks-") as out:
        procs = []
        for rank in range(world):
            env = {**rendezvous, "RANK": str(rank), "LOCAL_RANK": str(rank % procs_per_node)}
            procs.append(_CONTEXT.Process(target=_rank_main, args=(fn, args, env, out)))
            procs[-1].start()
        try:
            _wait_for_all(procs, timeout_s, Path(out))
        finally:
            for proc in procs:
                proc.kill()  # a no-op for the ranks that have ended
                proc.join()
        results = [Path(out, f"rank{rank}.result") for rank in range(world)]
        return [pickle.loads(r.read_bytes()) if r.exists() else None for r in results]


def _wait_for_all(procs: list, timeout_s: float, out: Path) -> None:
    """Return once every rank has ended with status 0; fail the test at the first rank that
    fails (the others usually fail or hang after it, in a collective it left) or at the
    deadline."""
    deadline = time.monotonic() + timeout_s
    running = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    while running:
        ended = wait(list(running), timeout=max(0.0, deadline - time.monotonic()))
        if not ended:
            hung = ", ".join(str(rank) for rank in sorted(running.values()))
            pytest.fail(f"rank(s) {hung} of {len(procs)} still running after {timeout_s:g} s",
                        pytrace=False)
        for sentinel in ended:
            rank = running.pop(sentinel)
            procs[rank].join()
            if procs[rank].exitcode != 0:
                error = out / f"rank{rank}.error"
                why = error.read_text() if error.exists() else "no Python exception"
                pytest.fail(f"rank {rank} of {len(procs)} failed (exit code "
                            f"{procs[rank].exitcode}):\n{why}", pytrace=False)
