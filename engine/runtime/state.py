"""The training loop's own state: one stateful part of every checkpoint, beside the shards."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from engine.anomaly import FaultManager
from engine.data.loader import TokenLoader
from engine.runtime.rebalance import Rebalancer
from engine.runtime.settings import LiveSettings
from engine.runtime.spec import JobSpec


class Optimizer(Protocol):
    adam_step: int  # the sharded optimizer's step count (its moments are in the shards)

    def set_weight_decay(self, weight_decay: float) -> None: ...


class TrainState:
    """Where the run is (optimizer steps done, tokens trained on) and what must resume with
    it: the data position and the ranks' shares of the batch, the RNG, Adam's step count, the
    replicated model buffers (the MoE expert bias), the detectors' and the response ladder's
    memory, the live settings (the `set` commands' changes over the spec) and whether the
    shares follow the ranks' speeds."""

    def __init__(self, model: nn.Module, optimizer: Optimizer, loader: TokenLoader,
                 faults: FaultManager, spec: JobSpec):
        self.step = 0  # optimizer steps done
        self.tokens = 0
        self.source_tokens = [0] * len(loader.sources)  # tokens trained on, per source
        self.model, self.optimizer, self.loader, self.faults = model, optimizer, loader, faults
        self.settings = LiveSettings(spec, optimizer, faults, loader)
        self.rebalancer = Rebalancer(loader, lambda: faults.detectors.thresholds["straggler"])

    def count_source_tokens(self, loader: TokenLoader, position: int) -> None:
        """Add the tokens of the step whose samples began at loader `position` to each
        source's count (exact without a collective: the blend knows every rank's samples)."""
        before, after = loader.source_counts(position), loader.source_counts(loader.position)
        self.source_tokens = [n + (b - a) * loader.seq_len for n, a, b in
                              zip(self.source_tokens, before, after, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        params = {name for name, _ in self.model.named_parameters()}
        return {
            "step": self.step,
            "tokens": self.tokens,
            "source_tokens": list(self.source_tokens),
            "adam_step": self.optimizer.adam_step,
            "faults": self.faults.state_dict(),
            "settings": self.settings.state_dict(),
            "loader": self.loader.state_dict(),
            "rebalance": self.rebalancer.state_dict(),
            "rng": torch.get_rng_state(),
            # replicated buffers travel whole (the parameters are in the shards)
            "buffers": {k: v.clone() for k, v in self.model.state_dict().items()
                        if k not in params},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens = state["step"], state["tokens"]
        # a checkpoint from before mixtures: its tokens were all the one source's
        self.source_tokens = list(state.get("source_tokens", [self.tokens]))
        self.optimizer.adam_step = state["adam_step"]
        self.loader.load_state_dict(state["loader"])
        torch.set_rng_state(state["rng"])
        self.model.load_state_dict(state["buffers"], strict=False)
        self.faults.load_state_dict(state["faults"])
        self.settings.load_state_dict(state.get("settings", {}))  # none before `set` existed
        self.rebalancer.load_state_dict(state.get("rebalance", {}))
