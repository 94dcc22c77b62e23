"""One rank's system metrics, sampled once per step: CPU %, RSS and, on CUDA, GPU memory and
utilisation. The aggregator gathers them with the step's timing row (no collective of their
own), so the step event carries every rank's numbers."""

from __future__ import annotations

import importlib.util
import math

import psutil
import torch

# every rank sends the same fields in the same order; one it cannot measure travels as NaN
SYSTEM_FIELDS = ("cpu_percent", "rss_bytes", "gpu_memory_bytes", "gpu_max_memory_bytes",
                 "gpu_util_percent")


class SystemSampler:
    """`sample()` once per step on every rank: `{field: value}` for SYSTEM_FIELDS."""

    def __init__(self, device: torch.device):
        self.device = device
        self.process = psutil.Process()
        self.process.cpu_percent()  # the first reading only starts psutil's interval
        # torch.cuda.utilization asks NVML through pynvml, an optional package
        self.nvml = device.type == "cuda" and importlib.util.find_spec("pynvml") is not None

    def sample(self) -> dict[str, float]:
        """CPU % of this process since the previous sample (100 per busy core), its resident
        memory in bytes, and on CUDA the bytes allocated now and at most since the start and
        the GPU's utilisation %."""
        gpu = [math.nan] * 3
        if self.device.type == "cuda":
            gpu[:2] = (torch.cuda.memory_allocated(self.device),
                       torch.cuda.max_memory_allocated(self.device))
            if self.nvml:
                gpu[2] = torch.cuda.utilization(self.device)
        values = (self.process.cpu_percent(), self.process.memory_info().rss, *gpu)
        return dict(zip(SYSTEM_FIELDS, (float(v) for v in values), strict=True))
