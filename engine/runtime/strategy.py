"""Which PaRO strategy a job trains with: the spec's, or the planner's pick for `auto`."""

from __future__ import annotations

import psutil
import torch
import torch.distributed as dist

from engine.horing import Topology
from engine.horing.cost import calibrate
from engine.paro import plan
from engine.runtime.distributed import local_world_size, param_dtype
from engine.runtime.spec import JobSpec


def choose_strategy(spec: JobSpec, topo: Topology, device: torch.device) -> str:
    """The spec's PaRO strategy, or for `auto` the planner's first pick for this model, the
    measured links and the memory of one device. Rank 0 decides; every rank gets its answer."""
    if spec.parallel.strategy != "auto":
        return spec.parallel.strategy
    links = calibrate(topo)
    if device.type == "cuda":
        budget = torch.cuda.get_device_properties(device).total_memory
    else:
        budget = psutil.virtual_memory().total // local_world_size(topo.world_size)
    rows = plan(spec.model, topo, budget, spec.train.grad_accum, links,
                dtype_bytes=param_dtype(device).itemsize, collective=spec.parallel.collective)
    choice = [rows[0].strategy]
    dist.broadcast_object_list(choice, src=0)
    return choice[0]
