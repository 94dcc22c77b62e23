"""Joining the job's process group, and the device and dtype every rank trains in."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_distributed(device: str) -> tuple[int, int, torch.device]:
    """Join the process group described by the launcher's environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT); gloo on CPU. On GPU, NCCL carries the CUDA tensors and gloo
    the small CPU ones that the control, anomaly and checkpoint agreements exchange."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
            is_master=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0,
        )
        # The launcher's store outlives a restart of the ranks: each incarnation gets its own
        # key space, or a restarted rank may read the address of a rank that has died.
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group("cuda:nccl,cpu:gloo" if device == "cuda" else "gloo",
                                store=dist.PrefixStore(f"ringside/{restart}", store),
                                rank=rank, world_size=world)
    return dist.get_rank(), dist.get_world_size(), dev


def local_world_size(world_size: int) -> int:
    """The ranks on this host (they share its cores and memory)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))


def param_dtype(device: torch.device) -> torch.dtype:
    """The parameters' dtype: bf16 on GPU, with fp32 master weights and Adam moments in the
    sharded optimizer (and the grouped-matmul dispatch, whose CUDA kernels take bf16 only);
    fp32 on CPU, the setting of the CPU benchmarks and convergence checks."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32
