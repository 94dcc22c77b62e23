"""A Ling-style MoE decoder (Ling 2.0 / BailingMoeV2, and Ling 1 via `router_mode="ling1"`).

Reads top to bottom: norms and rotary embedding, attention, the dense and expert FFNs, the
MoE layer, the decoder block, the multi-token-prediction layer, then the model and its
training-loop interface. See ../shared/specs/moe.md sections 1-5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.moe.config import MoEConfig
from engine.moe.dispatch import SlotOrder, routed_experts, sort_slots
from engine.moe.loss import (
    IGNORE_INDEX,
    chunk_tokens,
    linear_cross_entropy,
    linear_cross_entropy_tokens,
)
from engine.moe.router import Router


@dataclass
class ModelOutput:
    loss: torch.Tensor  # CE + mtp_w * CE_mtp + z_coef * sum z + aux_coef * sum aux
    ce_loss: torch.Tensor  # main head CE, nats per token, detached
    logits: torch.Tensor | None = None
    sample_ce: torch.Tensor | None = None  # [B]: each row's main head CE, detached


class _RMSNormCPU(torch.autograd.Function):
    """RMSNorm with a hand-written backward. On CPU `F.rms_norm` is a composite of six ops,
    and autograd's backward through them makes about ten passes over the activations, each
    into a fresh tensor; this one makes five (fwd+bwd of a [8, 256, 256] fp32 norm: 7.7 ms
    composite, 3.0 ms here; a tiny-model step has 25 norms, QK-norms included)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rows = x.reshape(-1, x.shape[-1])
        rstd = torch.linalg.vector_norm(rows, dim=-1, keepdim=True)
        rstd.square_().div_(rows.shape[-1]).add_(eps).rsqrt_()
        x_hat = rows * rstd
        ctx.save_for_backward(x_hat, rstd, weight)
        return (x_hat * weight).view(x.shape)

    @staticmethod
    def backward(ctx, d_y):
        x_hat, rstd, weight = ctx.saved_tensors
        d_rows = d_y.reshape(-1, d_y.shape[-1])
        d_weight = (d_rows * x_hat).sum(0)
        g = d_rows * weight
        # d x = rstd * (g - x_hat * mean(g * x_hat))
        d_x = torch.addcmul(g, x_hat, (g * x_hat).mean(-1, keepdim=True), value=-1).mul_(rstd)
        return d_x.view(d_y.shape), d_weight, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == self.weight.dtype == torch.float32:
            return _RMSNormCPU.apply(x, self.weight, self.eps)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rotary_tables(
    config: MoEConfig, seq_len: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rotary_dim / 2]: one angle per pair (i, i + rotary_dim / 2) of the
    rotate-half RoPE on the first rotary_dim head dims."""
    rotary_dim = int(config.head_dim * config.partial_rotary_factor)
    exponent = torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim
    inv_freq = config.rope_theta**-exponent
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x1, x2) of the first 2 * half dims by its angle: (x1 c - x2 s,
    x2 c + x1 s); the other dims are copied. Written into one fresh tensor, without the
    rotate-half concatenations."""
    half = cos.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    out1, out2 = out[..., :half], out[..., half : 2 * half]
    torch.mul(x1, cos, out=out1).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=out2).addcmul_(x1, sin)
    out[..., 2 * half :] = x[..., 2 * half :]
    return out


class _Rotary(torch.autograd.Function):
    """Partial rotate-half RoPE. Its gradient is the inverse rotation (the angle negated), so
    both passes are one `_rotate` each instead of autograd's path back through the slices,
    concatenations and products of the textbook form (a quarter of the attention's
    elementwise time on CPU)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, d_out):
        cos, sin = ctx.saved_tensors
        return _rotate(d_out, cos, -sin), None, None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, hd] rotated by the tables of `rotary_tables` ([T, half], or [B, T, half]
    at per-row positions); the dims past 2 * cos.shape[-1] pass through unrotated."""
    return _Rotary.apply(x, cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype))


def document_positions(
    doc_ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For rows of packed documents (doc_ids [B, T], each token's document, nondecreasing):
    the rotary tables at positions that restart with each document, [B, T, half], and the
    attention mask [B, 1, T, T] that keeps each token to the earlier tokens of its document."""
    index = torch.arange(doc_ids.shape[1], device=doc_ids.device)
    begins = torch.ones_like(doc_ids, dtype=torch.bool)
    begins[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    positions = index - torch.where(begins, index, 0).cummax(-1).values
    causal = torch.ones(len(index), len(index), dtype=torch.bool, device=doc_ids.device).tril()
    mask = (doc_ids[:, :, None] == doc_ids[:, None, :]) & causal
    return cos[positions], sin[positions], mask[:, None]


class Attention(nn.Module):
    """Grouped-query attention: fused query_key_value, per-head QK-norm before RoPE, SDPA."""

    def __init__(self, config: MoEConfig):
        super().__init__()
        c = config
        self.heads, self.kv_heads, self.head_dim = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        )
        qkv_out = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.query_key_value = nn.Linear(c.hidden_size, qkv_out, bias=c.use_qkv_bias)
        self.dense = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=c.use_bias)
        self.query_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.use_qk_norm else None
        self.key_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.use_qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """`mask` [B, 1, T, T] (True: may attend) replaces the causal mask: documents."""
        batch, seq, _ = x.shape
        qkv = self.query_key_value(x).view(batch, seq, -1, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        if self.query_norm is not None:
            q, k = self.query_norm(q), self.key_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            is_causal=mask is None,
            enable_gqa=self.kv_heads != self.heads,
        )
        return self.dense(out.transpose(1, 2).reshape(batch, seq, -1))


class SwiGLU(nn.Module):
    """down(silu(gate x) * up x): the dense FFN and the shared expert."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RoutedExperts(nn.Module):
    """E SwiGLU experts in fused weights (transformers v5 layout)."""

    def __init__(self, config: MoEConfig):
        super().__init__()
        e, d, f = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up = nn.Parameter(torch.empty(e, 2 * f, d))  # gate rows first
        self.down = nn.Parameter(torch.empty(e, d, f))
        self.impl = config.moe_impl

    def forward(self, x: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor,
                order: SlotOrder | None) -> torch.Tensor:
        """The weighted sum of each token's selected experts (a module, so it can be timed)."""
        return routed_experts(x, idx, weight, self.gate_up, self.down, self.impl, order)


class LMHead(nn.Linear):
    """The output projection and its loss; NormHead divides W by its detached column norm.

    Called, it returns the mean cross-entropy against the labels without materialising the
    logits (engine.moe.loss), so that the head and its loss are one timed op; `chunk_tokens`
    bounds the fp32 logits held at once. `logits` gives them whole (evaluation, export)."""

    def __init__(self, dim: int, vocab_size: int, norm_head: bool):
        super().__init__(dim, vocab_size, bias=False)
        self.norm_head = norm_head
        self.chunk_tokens = chunk_tokens(vocab_size)

    def head_weight(self) -> torch.Tensor:
        """W, divided by its column norms under NormHead (the gradient flows through)."""
        weight = self.weight
        if self.norm_head:
            weight = weight / (weight.detach().norm(dim=0, keepdim=True) + 1e-7)
        return weight

    def forward(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.head_weight(),
                                    labels.reshape(-1), self.chunk_tokens)

    def losses(self, h: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean cross-entropy and each row's (the mean over its kept tokens, detached)."""
        mean, tokens = linear_cross_entropy_tokens(h.reshape(-1, h.shape[-1]), self.head_weight(),
                                                   labels.reshape(-1), self.chunk_tokens)
        kept = (labels != IGNORE_INDEX).sum(-1).clamp(min=1)
        return mean, tokens.view(labels.shape).sum(-1) / kept

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.head_weight())


class MoE(nn.Module):
    """Router + dropless routed experts + ungated shared expert.

    While grad is enabled it adds the selection counts to `tokens_per_expert` and keeps the
    z-loss and logit max of the latest forward for `MoEModel.expert_stats`.
    """

    def __init__(self, config: MoEConfig):
        super().__init__()
        self.config = config
        self.router = Router(config)
        self.experts = RoutedExperts(config)
        shared_width = config.moe_intermediate_size * config.num_shared_experts
        self.shared = SwiGLU(config.hidden_size, shared_width) if shared_width else None
        self.register_buffer(
            "tokens_per_expert", torch.zeros(config.num_experts, dtype=torch.float32),
            persistent=False,
        )
        self.register_buffer("last_z_loss", torch.zeros(()), persistent=False)
        self.register_buffer("last_logit_max", torch.zeros(()), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        routing = self.router(x)
        impl = self.config.moe_impl
        order = None if impl == "loop" else sort_slots(routing.idx, self.config.num_experts)
        if torch.is_grad_enabled():
            counts = (
                order.counts
                if order is not None
                else torch.bincount(routing.idx.reshape(-1), minlength=self.config.num_experts)
            )
            self.tokens_per_expert += counts
            self.last_z_loss.copy_(routing.z_loss.detach())
            self.last_logit_max.copy_(routing.logit_absmax)
        y = self.experts(x, routing.idx, routing.weight, order)
        if self.shared is not None:
            y = y + self.shared(x)
        return y.view(shape), routing.z_loss, routing.aux_loss


class Block(nn.Module):
    """Pre-norm decoder layer: attention, then a dense SwiGLU or an MoE FFN."""

    def __init__(self, config: MoEConfig, moe: bool):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.ffn = MoE(config) if moe else SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = h + self.attention(self.attention_norm(h), cos, sin, mask)
        if isinstance(self.ffn, MoE):
            y, z_loss, aux_loss = self.ffn(self.ffn_norm(h))
        else:
            y, z_loss, aux_loss = self.ffn(self.ffn_norm(h)), h.new_zeros(()), h.new_zeros(())
        return h + y, z_loss, aux_loss


class MTPLayer(nn.Module):
    """One multi-token-prediction depth: eh_proj([norm(emb(next ids)); norm(h)]) -> block."""

    def __init__(self, config: MoEConfig):
        super().__init__()
        self.embed_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.block = Block(config, moe=True)
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, embedded_next: torch.Tensor, h: torch.Tensor, cos, sin, mask=None):
        z = self.eh_proj(torch.cat([self.embed_norm(embedded_next), self.hidden_norm(h)], -1))
        return self.block(z, cos, sin, mask)


def _shift_left(x: torch.Tensor, steps: int, fill: int) -> torch.Tensor:
    shifted = torch.full_like(x, fill)
    shifted[:, : x.shape[1] - steps] = x[:, steps:]
    return shifted


class MoEModel(nn.Module):
    def __init__(self, config: MoEConfig):
        super().__init__()
        errors = config.validate()
        if errors:
            details = "; ".join(f"{field}: {message}" for field, message in errors.items())
            raise ValueError(f"invalid MoEConfig: {details}")
        self.config = config
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(
            Block(c, moe=i >= c.first_k_dense_replace) for i in range(c.num_hidden_layers)
        )
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = LMHead(c.hidden_size, c.vocab_size, c.norm_head)
        self.mtp = nn.ModuleList(MTPLayer(c) for _ in range(c.num_nextn_predict_layers))
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.moe_layers: list[MoE] = [m for m in self.modules() if isinstance(m, MoE)]
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """N(0, sigma) everywhere incl. router and experts; norms 1; output projections
        scaled by 1/sqrt(2L) when `init_scaled_out` (moe.md section 4)."""
        c = self.config
        std = c.initializer_range
        out_std = std / math.sqrt(2 * c.num_hidden_layers) if c.init_scaled_out else std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, Router):
                nn.init.normal_(module.weight, 0.0, std)
            elif isinstance(module, RoutedExperts):
                nn.init.normal_(module.gate_up, 0.0, std)
                nn.init.normal_(module.down, 0.0, out_std)
            elif isinstance(module, Attention):
                nn.init.normal_(module.dense.weight, 0.0, out_std)
            elif isinstance(module, SwiGLU):
                nn.init.normal_(module.gate_proj.weight, 0.0, std)
                nn.init.normal_(module.up_proj.weight, 0.0, std)
                nn.init.normal_(module.down_proj.weight, 0.0, out_std)

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor, return_logits: bool = False,
        doc_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        """`doc_ids` [B, T] (engine.data.loader's document mask): each token's document in
        its row; attention then stays inside each document and positions restart with it."""
        c = self.config
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        if labels.shape != input_ids.shape:
            raise ValueError(
                f"labels shape {tuple(labels.shape)} must equal input_ids shape "
                f"{tuple(input_ids.shape)}"
            )
        seq_len = input_ids.shape[1]
        if seq_len > c.max_position_embeddings:
            raise ValueError(
                f"input_ids length {seq_len} exceeds max_position_embeddings "
                f"({c.max_position_embeddings})"
            )
        cos, sin = rotary_tables(c, seq_len, input_ids.device)
        mask = None
        if doc_ids is not None:
            cos, sin, mask = document_positions(doc_ids.to(input_ids.device), cos, sin)
        h = self.embed_tokens(input_ids)
        z_losses, aux_losses = [], []
        for layer in self.layers:
            h, z_loss, aux_loss = layer(h, cos, sin, mask)
            z_losses.append(z_loss)
            aux_losses.append(aux_loss)
        final = self.norm(h)
        ce, sample_ce = self.lm_head.losses(final, labels)
        loss = ce

        if self.training and len(self.mtp):
            mtp_ce = []
            for depth, mtp in enumerate(self.mtp, start=1):
                embedded_next = self.embed_tokens(_shift_left(input_ids, depth, 0))
                h, z_loss, aux_loss = mtp(embedded_next, h, cos, sin, mask)
                z_losses.append(z_loss)
                aux_losses.append(aux_loss)
                mtp_labels = _shift_left(labels, depth, IGNORE_INDEX)
                mtp_ce.append(self.lm_head(mtp.final_norm(h), mtp_labels))
            loss = loss + c.mtp_loss_scaling_factor * torch.stack(mtp_ce).mean()
        if c.z_loss_coef and z_losses:
            loss = loss + c.z_loss_coef * torch.stack(z_losses).sum()
        if c.aux_loss_coef and aux_losses:
            loss = loss + c.aux_loss_coef * torch.stack(aux_losses).sum()
        logits = self.lm_head.logits(final) if return_logits else None
        return ModelOutput(loss, ce.detach(), logits, sample_ce)

    # --- the training loop's interface -----------------------------------------------------

    def routing_counts(self) -> torch.Tensor:
        """[n_moe_layers, E] fp32 tokens routed per expert (training forwards) since reset.
        Rows: the MoE decoder layers in order, then the MTP layers'."""
        return torch.stack([m.tokens_per_expert for m in self.moe_layers])

    def reset_routing_counts(self) -> None:
        for m in self.moe_layers:
            m.tokens_per_expert.zero_()

    def update_expert_bias(self, counts: torch.Tensor) -> None:
        """Aux-loss-free bias update with counts summed over micro-batches and DP ranks."""
        if counts.shape != (len(self.moe_layers), self.config.num_experts):
            raise ValueError(
                f"counts must have shape [{len(self.moe_layers)}, {self.config.num_experts}], "
                f"got {tuple(counts.shape)}"
            )
        for m, layer_counts in zip(self.moe_layers, counts, strict=True):
            m.router.update_expert_bias(layer_counts)

    def set_step(self, step: int) -> None:
        for m in self.moe_layers:
            m.router.step = step

    def expert_stats(self, counts: torch.Tensor) -> list[dict]:
        """One `experts`-event entry per MoE layer (moe.md section 8)."""
        counts = counts.detach().double().cpu()
        num_experts = counts.shape[-1]
        max_entropy = math.log(num_experts) if num_experts > 1 else 1.0
        stats = []
        for m, c in zip(self.moe_layers, counts, strict=True):
            total = c.sum()
            fraction = c / total if total > 0 else torch.full_like(c, 1 / num_experts)
            entropy = -(fraction * fraction.clamp_min(1e-30).log()).sum()
            bias = m.router.expert_bias.detach().double().cpu()
            stats.append(
                {
                    "tokens_per_expert": [int(v) for v in c.round().tolist()],
                    "max_violation": float(c.max() / c.mean() - 1) if total > 0 else 0.0,
                    "dead_experts": int((c == 0).sum()),
                    "load_entropy": float(entropy / max_entropy),
                    "z_loss": float(m.last_z_loss),
                    "router_logit_max": float(m.last_logit_max),
                    "expert_bias": {
                        "mean": float(bias.mean()),
                        "std": float(bias.std(unbiased=False)),
                        "absmax": float(bias.abs().max()),
                    },
                }
            )
        return stats


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """The module with its parameters, and not its buffers, in `dtype` (bf16 training on GPU):
    the routing state (expert bias, token counts, z-loss) stays fp32, where a count of tokens
    is exact and a bias update of 1e-3 is not rounded away."""
    for parameter in module.parameters():
        parameter.data = parameter.data.to(dtype)
    return module
