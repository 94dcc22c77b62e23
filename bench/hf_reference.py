"""transformers' twin of our MoE layer, with our weights copied in: the reference that the
parity tests and the layer benchmark compare against (moe.md section 7)."""

from __future__ import annotations

import torch
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

from engine.moe.model import MoE


def hf_layer_like(ours: MoE, experts_implementation: str) -> DeepseekV3MoE:
    c = ours.config
    config = DeepseekV3Config(
        hidden_size=c.hidden_size, moe_intermediate_size=c.moe_intermediate_size,
        n_routed_experts=c.num_experts, num_experts_per_tok=c.num_experts_per_tok,
        n_shared_experts=c.num_shared_experts, n_group=c.n_group, topk_group=c.topk_group,
        routed_scaling_factor=c.routed_scaling_factor, norm_topk_prob=c.norm_topk_prob,
    )
    config._experts_implementation = experts_implementation
    hf = DeepseekV3MoE(config)
    with torch.no_grad():
        hf.gate.weight.copy_(ours.router.weight)
        hf.gate.e_score_correction_bias.copy_(ours.router.expert_bias)
        hf.experts.gate_up_proj.copy_(ours.experts.gate_up)
        hf.experts.down_proj.copy_(ours.experts.down)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(hf.shared_experts, name).weight.copy_(getattr(ours.shared, name).weight)
    return hf
