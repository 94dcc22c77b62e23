"""torchtitan's twin of our MoE layer, with our weights copied in: the layer an engineer would
otherwise train with (router, sort-by-expert dispatch and `torch._grouped_mm` experts in bf16),
the reference of the torchtitan parity tests and of the layer benchmark's production shapes.

torchtitan comes from bench/references.txt (installed by `make install`)."""

from __future__ import annotations

import torch
from torchtitan.models.common.feed_forward import FeedForward
from torchtitan.models.common.linear import Linear
from torchtitan.models.common.moe import (
    GroupedExperts,
    RoutedExperts,
    TokenChoiceTopKRouter,
)
from torchtitan.models.common.moe import (
    MoE as TitanMoE,
)
from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher

from engine.moe.model import MoE


def _linear(fan_in: int, fan_out: int) -> Linear.Config:
    return Linear.Config(in_features=fan_in, out_features=fan_out)


def titan_layer_like(ours: MoE) -> TitanMoE:
    c = ours.config
    d, e, k, f = c.hidden_size, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size
    shared = f * c.num_shared_experts
    grouped = c.n_group > 1
    config = TitanMoE.Config(
        num_experts=e,
        routed_experts=RoutedExperts.Config(
            inner_experts=GroupedExperts.Config(dim=d, hidden_dim=f, num_experts=e),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=e, top_k=k),
        ),
        router=TokenChoiceTopKRouter.Config(
            num_experts=e, gate=_linear(d, e), top_k=k, score_func=c.score_function,
            num_expert_groups=c.n_group if grouped else None,
            num_limited_groups=c.topk_group if grouped else None,
            route_norm=c.norm_topk_prob and k > 1, route_scale=c.routed_scaling_factor,
        ),
        load_balance_coeff=1e-3 if c.moe_router_enable_expert_bias else None,
        shared_experts=FeedForward.Config(
            w1=_linear(d, shared), w2=_linear(shared, d), w3=_linear(d, shared)
        ) if shared else None,
    )
    titan = config.build()
    with torch.no_grad():
        titan.router.gate.weight.copy_(ours.router.weight)
        if titan.expert_bias_E is not None:
            titan.expert_bias_E.copy_(ours.router.expert_bias)
        experts = titan.routed_experts.inner_experts
        experts.w1_EFD.copy_(ours.experts.gate_up[:, :f])
        experts.w3_EFD.copy_(ours.experts.gate_up[:, f:])
        experts.w2_EDF.copy_(ours.experts.down)
        if shared:
            titan.shared_experts.w1.weight.copy_(ours.shared.gate_proj.weight)
            titan.shared_experts.w3.weight.copy_(ours.shared.up_proj.weight)
            titan.shared_experts.w2.weight.copy_(ours.shared.down_proj.weight)
    return titan
