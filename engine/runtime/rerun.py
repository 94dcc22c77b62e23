"""The `rerun` rung: a step that spiked is trained again on the same data from the same state,
which tells a bad batch (the spike comes back) from a bad step (it does not), as Megatron's
rerun state machine does within one iteration.

    rng = rng_state(device)                  # before the step's forward-backward
    ...                                      # the step spiked and the ladder says rerun:
    restore_rng(rng, device)                 # drop its gradients, rewind the loader, and
    again = forward_backward()               # train the same micro-batches again
    found = attribute(*gather_losses(first, again), spiking_ranks)

Each rank compares its own loss, first and again: the model has no randomness of its own, but
the RNG states are restored all the same, so a rerun is the same computation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from engine.contract import RerunCause

# how far apart a rank's loss may be, first and again, and still be the same result: the same
# computation on the same data gives the same bits on CPU; on a GPU a reduction's order may
# move the last digits, never a spike's worth
RTOL = 1e-3

RngState = tuple[torch.Tensor, torch.Tensor | None]


def rng_state(device: torch.device) -> RngState:
    """The RNG states a step's forward-backward draws from (the host's, the device's)."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device)
                                   if device.type == "cuda" else None)


def restore_rng(state: RngState, device: torch.device) -> None:
    host, accelerator = state
    torch.set_rng_state(host)
    if accelerator is not None:
        torch.cuda.set_rng_state(accelerator, device)


def gather_losses(first: float, again: float) -> tuple[list[float], list[float]]:
    """Collective: every rank's loss, first and again, in rank order."""
    mine = torch.tensor([first, again], dtype=torch.float64)
    if not (dist.is_available() and dist.is_initialized()):
        return [first], [again]
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [float(t[0]) for t in everyone], [float(t[1]) for t in everyone]


def same_result(a: float, b: float) -> bool:
    """Whether two losses are one result (NaN again counts as the same)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= RTOL * max(abs(a), abs(b))


@dataclass(frozen=True)
class Attribution:
    """What a rerun found. `spiking`: the ranks the spike was found on; `differed`: the ranks
    whose loss came out otherwise the second time (the suspects of silent data corruption)."""

    cause: RerunCause
    first: list[float]
    again: list[float]
    spiking: list[int]
    differed: list[int]

    def details(self) -> dict[str, Any]:
        """What the `action` event of the rerun says about it."""
        return {"cause": str(self.cause), "spiking_ranks": self.spiking,
                "differed_ranks": self.differed, "loss": self.first, "rerun_loss": self.again}


def attribute(first: list[float], again: list[float], spiking: Iterable[int]) -> Attribution:
    """The data is the cause when every rank the spike was found on gets the same result
    again; otherwise the step was (a transient fault of its computation)."""
    differed = [r for r, (a, b) in enumerate(zip(first, again, strict=True))
                if not same_result(a, b)]
    spiking = sorted(spiking)
    cause = RerunCause.STEP if set(spiking) & set(differed) else RerunCause.DATA
    return Attribution(cause, first, again, spiking, differed)
