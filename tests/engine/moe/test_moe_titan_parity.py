"""Our MoE layer equals torchtitan's on copied weights, forwards and backwards: the same
experts chosen, and outputs and gradients within what bf16 leaves (torchtitan runs its
experts in bf16 whatever the input's dtype; bf16 keeps about 3 significant digits)."""

from __future__ import annotations

import pytest
import torch

from bench.moe_layer import BF16_RELATIVE, relative_error
from bench.titan_reference import titan_layer_like
from engine.moe import cast_parameters, preset
from engine.moe.model import MoE

torch.set_num_threads(1)


def ours_layer(name: str, device: str = "cpu", **changes) -> MoE:
    torch.manual_seed(0)
    with torch.device(device):  # a flash-sized layer is 3.2B parameters: made where it runs
        layer = MoE(preset(name).replace(**changes))
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.05 if name == "tiny" else 0.02)
        layer.router.expert_bias.uniform_(-0.05, 0.05)  # exercised in the choice
    return layer


def assert_twins(ours: MoE, x: torch.Tensor) -> None:
    with torch.device(x.device):
        titan = titan_layer_like(ours)
    if x.dtype != torch.float32:
        cast_parameters(titan, x.dtype)
    x_ours, x_titan = x.clone().requires_grad_(), x.clone().requires_grad_()

    _, titan_idx, _ = titan.router(x.detach(), titan.expert_bias_E)
    ours_idx = ours.router(x.detach().view(-1, x.shape[-1])).idx
    assert torch.equal(ours_idx.sort(-1).values, titan_idx.view(ours_idx.shape).sort(-1).values)

    y_ours, _, _ = ours(x_ours)
    y_titan = titan(x_titan)
    assert relative_error(y_titan, y_ours) <= BF16_RELATIVE
    grad = torch.randn(y_ours.shape, generator=torch.Generator().manual_seed(2)).to(y_ours)
    y_ours.backward(grad)
    y_titan.backward(grad)
    experts = titan.routed_experts.inner_experts
    f = ours.config.moe_intermediate_size
    pairs = {
        "input": (x_ours.grad, x_titan.grad),
        "router": (ours.router.weight.grad, titan.router.gate.weight.grad),
        "gate": (ours.experts.gate_up.grad[:, :f], experts.w1_EFD.grad),
        "up": (ours.experts.gate_up.grad[:, f:], experts.w3_EFD.grad),
        "down": (ours.experts.down.grad, experts.w2_EDF.grad),
        "shared down": (ours.shared.down_proj.weight.grad, titan.shared_experts.w2.weight.grad),
    }
    for name, (a, b) in pairs.items():
        assert relative_error(b, a) <= BF16_RELATIVE, f"{name} gradient differs"


@pytest.mark.parametrize(
    "changes",
    [{}, {"num_experts": 32, "n_group": 4, "topk_group": 2, "moe_intermediate_size": 32},
     {"num_shared_experts": 2, "num_experts_per_tok": 6}],
    ids=["tiny", "E32-groups4of2", "shared2-k6"],
)
def test_layer_equals_torchtitans_moe(changes):
    ours = ours_layer("tiny", **changes)
    x = torch.randn(3, 100, ours.config.hidden_size, generator=torch.Generator().manual_seed(1))
    assert_twins(ours, x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["ling-mini-2.0", "ling-flash-2.0"])
def test_on_cuda_bf16_the_production_layer_equals_torchtitans(name):
    ours = cast_parameters(ours_layer(name, "cuda"), torch.bfloat16)
    x = torch.randn(2, 2048, ours.config.hidden_size, generator=torch.Generator().manual_seed(1))
    assert_twins(ours, x.to("cuda", torch.bfloat16))
