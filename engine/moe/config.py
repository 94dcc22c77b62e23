"""The model's one typed configuration object and its presets.

Field names follow transformers' `BailingMoeV2Config` so that Ling checkpoints map 1:1;
the Ringside additions (router mode, bias update rate, loss coefficients, dispatch
implementation) come last. See ../shared/specs/moe.md sections 2-3.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

RouterMode = Literal["ling2", "ling1"]
MoEImpl = Literal["grouped_mm", "padded_bmm", "loop"]

# Upper bounds of the integer fields (the spec table in README.md lists them): far above the
# published Ling models, low enough that a typo cannot ask for an unbounded model.
BOUNDS: dict[str, int] = {
    "vocab_size": 1 << 20,
    "hidden_size": 65536,
    "intermediate_size": 1 << 18,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 1024,
    "max_position_embeddings": 1 << 20,
    "num_experts": 4096,
    "num_shared_experts": 64,
    "num_experts_per_tok": 256,
    "n_group": 256,
    "topk_group": 256,
    "moe_intermediate_size": 65536,
    "first_k_dense_replace": 1024,
    "num_nextn_predict_layers": 16,
    "srw_warmup_steps": 1_000_000,
}


@dataclass
class MoEConfig:
    vocab_size: int = 256
    hidden_size: int = 256
    intermediate_size: int = 640
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    use_qkv_bias: bool = False
    use_bias: bool = False
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.5
    use_qk_norm: bool = True
    num_experts: int = 64
    num_shared_experts: int = 1
    num_experts_per_tok: int = 4
    n_group: int = 8
    topk_group: int = 4
    moe_intermediate_size: int = 64
    first_k_dense_replace: int = 1
    routed_scaling_factor: float = 2.5
    norm_topk_prob: bool = True
    score_function: Literal["sigmoid", "softmax"] = "sigmoid"
    moe_router_enable_expert_bias: bool = True
    num_nextn_predict_layers: int = 1
    mtp_loss_scaling_factor: float = 0.1
    # Ringside additions
    router_mode: RouterMode = "ling2"
    bias_update_rate: float = 1e-2
    bias_zero_mean: bool = True
    aux_loss_coef: float = 0.0
    z_loss_coef: float = 3.5e-6
    srw_warmup_steps: int = 0
    norm_head: bool = False
    init_scaled_out: bool = True
    moe_impl: MoEImpl = "grouped_mm"

    def validate(self) -> dict[str, str]:
        """Cross-field checks; returns {field: message} for every violation."""
        errors: dict[str, str] = {}
        positive = (
            "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads "
            "num_key_value_heads head_dim num_experts num_experts_per_tok n_group topk_group "
            "moe_intermediate_size max_position_embeddings"
        ).split()
        for name in positive:
            if getattr(self, name) < 1:
                errors[name] = "must be at least 1"
        for name, most in BOUNDS.items():
            if getattr(self, name) > most:
                errors[name] = f"must be at most {most}"
        if errors:
            return errors
        if self.num_attention_heads % self.num_key_value_heads:
            errors["num_key_value_heads"] = (
                f"must divide num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_experts_per_tok > self.num_experts:
            errors["num_experts_per_tok"] = f"must be at most num_experts ({self.num_experts})"
        if self.num_experts % self.n_group:
            errors["n_group"] = f"must divide num_experts ({self.num_experts})"
        elif self.n_group > 1 and self.num_experts // self.n_group < 2:
            errors["n_group"] = "each group needs at least 2 experts"
        if self.topk_group > self.n_group:
            errors["topk_group"] = f"must be at most n_group ({self.n_group})"
        elif self.n_group > 1 and (
            self.topk_group * (self.num_experts // self.n_group) < self.num_experts_per_tok
        ):
            errors["topk_group"] = "the kept groups hold fewer experts than num_experts_per_tok"
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            errors["partial_rotary_factor"] = "must be in (0, 1]"
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            errors["first_k_dense_replace"] = (
                f"must be between 0 and num_hidden_layers ({self.num_hidden_layers})"
            )
        if self.num_shared_experts < 0:
            errors["num_shared_experts"] = "must be at least 0"
        if self.num_nextn_predict_layers < 0:
            errors["num_nextn_predict_layers"] = "must be at least 0"
        if self.router_mode == "ling2" and self.score_function != "sigmoid":
            errors["score_function"] = "the ling2 router uses sigmoid scores"
        if self.router_mode == "ling1" and self.score_function != "softmax":
            errors["score_function"] = "the ling1 router uses softmax scores"
        return errors

    def replace(self, **changes: object) -> MoEConfig:
        return dataclasses.replace(self, **changes)


_LING1 = dict(
    router_mode="ling1",
    score_function="softmax",
    moe_router_enable_expert_bias=False,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=1.0,
    use_qk_norm=False,
    partial_rotary_factor=1.0,
    norm_head=True,
    num_nextn_predict_layers=0,
    first_k_dense_replace=0,
    aux_loss_coef=0.015,
    z_loss_coef=1e-4,
)

# what the Ling 2.0 models share; the published checkpoints ship without their MTP layer
_LING2 = dict(
    vocab_size=157184, num_key_value_heads=4, head_dim=128, num_experts=256,
    num_experts_per_tok=8, num_shared_experts=1, n_group=8, topk_group=4,
    first_k_dense_replace=1, initializer_range=0.006, max_position_embeddings=32768,
    bias_update_rate=1e-3, num_nextn_predict_layers=0,
)

PRESETS: dict[str, MoEConfig] = {
    "nano": MoEConfig(
        vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=8, num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=32,
        n_group=2, topk_group=1, first_k_dense_replace=1,
    ),
    "tiny": MoEConfig(),
    "small": MoEConfig(
        hidden_size=512, intermediate_size=1280, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=4, head_dim=64,
        num_experts=64, num_experts_per_tok=6, moe_intermediate_size=128,
    ),
    "ling-lite": MoEConfig(
        vocab_size=126464, hidden_size=2048, intermediate_size=5632, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=4, head_dim=128,
        num_experts=64, num_experts_per_tok=6, num_shared_experts=2,
        moe_intermediate_size=1408, rms_norm_eps=1e-5, initializer_range=0.006,
        max_position_embeddings=16384, **_LING1,
    ),
    "ling-mini-2.0": MoEConfig(
        hidden_size=2048, intermediate_size=5120, num_hidden_layers=20, num_attention_heads=16,
        moe_intermediate_size=512, **_LING2,
    ),
    # KV heads and router groups are not published for flash: 4 and 8/4, as mini's
    "ling-flash-2.0": MoEConfig(
        hidden_size=4096, intermediate_size=9216, num_hidden_layers=32, num_attention_heads=32,
        moe_intermediate_size=1024, **_LING2,
    ),
}


def param_count(config: MoEConfig, active: bool = False) -> int:
    """Parameters of `MoEModel(config)`, counted from the config alone (no torch: the platform's
    planner runs this in web processes). `active`: counting only `num_experts_per_tok` routed
    experts per MoE layer (what one token uses), as the published "activated parameters" do."""
    c = config
    hidden, vocab = c.hidden_size, c.vocab_size
    heads = c.num_attention_heads + 2 * c.num_key_value_heads
    attention = (hidden * heads * c.head_dim + c.num_attention_heads * c.head_dim * hidden
                 + c.use_qkv_bias * heads * c.head_dim + c.use_bias * hidden
                 + c.use_qk_norm * 2 * c.head_dim)
    expert = 3 * hidden * c.moe_intermediate_size  # gate, up and down projections
    experts = c.num_experts_per_tok if active else c.num_experts
    moe = c.num_experts * hidden + experts * expert + c.num_shared_experts * expert
    dense = 3 * hidden * c.intermediate_size

    def block(is_moe: bool) -> int:  # two norms, attention, the feed-forward
        return 2 * hidden + attention + (moe if is_moe else dense)

    layers = sum(block(i >= c.first_k_dense_replace) for i in range(c.num_hidden_layers))
    mtp = 2 * hidden + 2 * hidden * hidden + block(True) + hidden
    head = 0 if c.tie_word_embeddings else vocab * hidden
    return vocab * hidden + layers + hidden + head + c.num_nextn_predict_layers * mtp


def flops_per_token(config: MoEConfig, seq_len: int) -> float:
    """Training FLOPs (forward and backward) per token at `seq_len`, from the config alone:
    6 per active matrix weight (the embedding is a lookup, not a matmul) plus attention's
    scores and values, 6 * seq_len * heads * head_dim per layer for a causal mask (the
    PaLM estimate, halved for causality)."""
    c = config
    weights = param_count(c, active=True) - c.vocab_size * c.hidden_size
    layers = c.num_hidden_layers + c.num_nextn_predict_layers
    return 6 * weights + 6 * layers * seq_len * c.num_attention_heads * c.head_dim


def preset(name: str) -> MoEConfig:
    """A fresh copy of the named preset (KeyError lists the valid names)."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name])
