"""What the planner needs to know about a host, measured once: its training FLOP/s and the
links between its ranks.

    python -m engine.paro.calibrate        # one JSON object on stdout

- `flops_per_s`: the engine's own training step (forward, backward and AdamW of the tiny
  preset's model at micro-batch 4 x 256 tokens) on one thread, over the FLOPs
  `engine.moe.config.flops_per_token` counts for it, times the cores: every rank of a job
  runs one thread per core it gets, so this is the rate all of a host's ranks share. Timed
  in the thread's CPU time: on a busy host the wall clock measures the other tenants (it
  swung 24-95 GFLOP/s on a shared 2-core machine), and the rate is kept for good. A bare
  matmul runs 3-5x faster than a training step of these models on CPU (attention, routing,
  norms and the optimizer are in the step too), so it would not price one.
- `links`: `engine.horing.cost.calibrate` on 2x2 gloo ranks of this host (nodes are groups
  of ranks on one host here, as in a job).

A command, not a function of the platform: torch must never load in a web process, and the
Celery worker that asks (jobs.calibration) may not fork ranks of its own.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.horing.cost import calibrate
from engine.horing.topology import Topology
from engine.moe.config import flops_per_token, preset
from engine.moe.model import MoEModel
from engine.ports import free_port

PRESET, MICRO_BATCH, SEQ_LEN = "tiny", 4, 256


def training_flops_per_s(repeats: int = 3) -> float:
    """The host's training FLOP/s: one thread's rate on the tiny model, times the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        config = preset(PRESET)
        model = MoEModel(config)
        optimizer = torch.optim.AdamW(model.parameters())
        tokens = torch.randint(0, config.vocab_size, (MICRO_BATCH, SEQ_LEN))
        times = []
        for _ in range(repeats + 1):  # the first step allocates: not timed
            start = time.thread_time()
            model(tokens, tokens).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            times.append(time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)
    flops = flops_per_token(config, SEQ_LEN) * MICRO_BATCH * SEQ_LEN
    return flops / statistics.median(times[1:]) * (os.cpu_count() or 1)


def _probe_links(rank: int, world: int, port: int, out: mp.SimpleQueue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        links = calibrate(Topology(2, world // 2).init_groups())
        if rank == 0:
            out.put({tier: {"latency_s": t.latency_s, "bandwidth": t.bandwidth}
                     for tier, t in (("intra", links.intra), ("inter", links.inter))})
    finally:
        dist.destroy_process_group()


def host_links(world: int = 4) -> dict:
    """Both tiers measured on `world` gloo ranks of this host as 2 nodes."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_probe_links, args=(world, free_port(), out), nprocs=world,
                       start_method="spawn")
    return out.get()


def main() -> None:
    print(json.dumps({"device": "cpu", "flops_per_s": training_flops_per_s(),
                      "links": host_links()}))


if __name__ == "__main__":
    main()
