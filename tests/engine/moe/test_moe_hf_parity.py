"""Our MoE layer equals transformers' DeepseekV3MoE (same maths as BailingMoeV2) on copied
weights, forwards and backwards, for both of transformers' expert implementations."""

from __future__ import annotations

import pytest
import torch

from bench.hf_reference import hf_layer_like
from engine.moe import preset
from engine.moe.model import MoE

torch.set_num_threads(1)


def ours_layer(seed: int, **changes) -> MoE:
    torch.manual_seed(seed)
    layer = MoE(preset("tiny").replace(**changes))
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.05)
        layer.router.expert_bias.uniform_(-0.05, 0.05)  # exercised in the choice
    return layer


@pytest.mark.parametrize("experts_implementation", ["eager", "grouped_mm"])
@pytest.mark.parametrize(
    "changes",
    [{}, {"num_experts": 32, "n_group": 4, "topk_group": 2, "moe_intermediate_size": 32},
     {"num_shared_experts": 2, "num_experts_per_tok": 6}],
    ids=["tiny", "E32-groups4of2", "shared2-k6"],
)
def test_layer_equals_deepseek_v3_moe(experts_implementation, changes):
    ours = ours_layer(0, **changes)
    hf = hf_layer_like(ours, experts_implementation)
    x = torch.randn(3, 100, ours.config.hidden_size, generator=torch.Generator().manual_seed(1))
    x_ours, x_hf = x.clone().requires_grad_(), x.clone().requires_grad_()

    _, _, hf_idx = hf.gate(x_hf.detach())
    ours_idx = ours.router(x_ours.detach().view(-1, x.shape[-1])).idx
    assert torch.equal(ours_idx.sort(-1).values, hf_idx.sort(-1).values), "routing differs"

    y_ours, _, _ = ours(x_ours)
    y_hf = hf(x_hf)
    torch.testing.assert_close(y_ours, y_hf, atol=1e-6, rtol=1e-6)
    grad = torch.randn(y_hf.shape, generator=torch.Generator().manual_seed(2))
    y_ours.backward(grad)
    y_hf.backward(grad)
    torch.testing.assert_close(x_ours.grad, x_hf.grad, atol=1e-6, rtol=1e-6)
    pairs = [
        (ours.router.weight, hf.gate.weight),
        (ours.experts.gate_up, hf.experts.gate_up_proj),
        (ours.experts.down, hf.experts.down_proj),
        (ours.shared.down_proj.weight, hf.shared_experts.down_proj.weight),
    ]
    # weight gradients sum over all 300 tokens, so their rounding error is ~300x an output's
    for a, b in pairs:
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-5)
