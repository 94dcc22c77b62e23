"""time_modules: a model's modules timed through forward hooks, removable."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.xputimer import OpTimer, time_modules

torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.mlp = nn.Linear(8, 8)

    def forward(self, x):
        return self.mlp(self.norm(x))


def test_each_matching_module_is_an_op_named_by_its_path_and_nested_in_its_parent():
    model = nn.Sequential(Block(), Block())
    timer = OpTimer(sample_every=1)
    handles = time_modules(model, timer, {Block: "compute", nn.Linear: "matmul"})
    model(torch.randn(2, 8))
    t = timer.step_end(1)
    assert set(t.ops) == {"0", "1", "0.mlp", "1.mlp"}
    assert t.ops["0.mlp"].kind == "matmul" and t.ops["0"].kind == "compute"
    assert t.ops["0.mlp"].total_ms <= t.ops["0"].total_ms
    # nested ops are not counted twice: the covered time is the two blocks'
    assert t.covered_ms == pytest.approx(t.ops["0"].total_ms + t.ops["1"].total_ms)
    for h in handles:
        h.remove()
    model(torch.randn(2, 8))
    assert timer.step_end(2).ops == {}
