"""Top-k routers (moe.md section 5).

`ling2`: sigmoid scores; the fp32 `expert_bias` is added for the choice of experts only;
group-limited top-k; weights are the chosen raw scores renormalised and multiplied by
`routed_scaling_factor`; balance comes from the aux-loss-free bias update, applied by
`update_expert_bias` once per optimizer step.

`ling1`: softmax top-k, renormalised; balance comes from the auxiliary loss
`E * sum_i f_i * P_i` (1 at perfect balance) and Stochastic Routing Warmup.

Both return the router z-loss `mean_t logsumexp(s_t)^2`; logits are always fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.moe.config import MoEConfig

SRW_MOMENTUM = 0.9


@dataclass
class Routing:
    idx: torch.Tensor  # [T, k] chosen experts
    weight: torch.Tensor  # [T, k] fp32 combine weights
    z_loss: torch.Tensor  # scalar
    aux_loss: torch.Tensor  # scalar; zero for ling2
    logit_absmax: torch.Tensor  # scalar, detached


def group_limited_topk(
    choice: torch.Tensor, k: int, n_group: int, topk_group: int
) -> torch.Tensor:
    """Indices [T, k] of the top-k of `choice` [T, E] among the `topk_group` groups whose two
    best scores sum highest (DeepSeek-V3 / Ling 2.0). `n_group == 1` is plain top-k."""
    if n_group > 1:
        tokens, num_experts = choice.shape
        grouped = choice.view(tokens, n_group, num_experts // n_group)
        # sum of each group's two best scores; max + runner-up is 2x faster than topk(2)
        best, best_idx = grouped.max(-1)
        runner_up = grouped.scatter(-1, best_idx.unsqueeze(-1), float("-inf")).amax(-1)
        group_score = best + runner_up
        kept = group_score.topk(topk_group, dim=-1, sorted=False).indices
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept, True)
        choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(tokens, num_experts)
    return choice.topk(k, dim=-1, sorted=False).indices


class Router(nn.Module):
    def __init__(self, config: MoEConfig):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(config.num_experts, dtype=torch.float32))
        # Stochastic Routing Warmup: scalar EMA of the logits' mean and std (NaN = unset).
        self.register_buffer("srw_stats", torch.full((2,), float("nan")), persistent=False)
        self.step = 0

    def forward(self, x: torch.Tensor) -> Routing:
        c = self.config
        logits = F.linear(x.float(), self.weight.float())
        z_loss = torch.logsumexp(logits, dim=-1).square().mean()
        logit_absmax = logits.detach().abs().max()
        if c.router_mode == "ling1" and c.srw_warmup_steps > 0 and torch.is_grad_enabled():
            logits = self._stochastic_warmup(logits)

        scores = torch.sigmoid(logits) if c.score_function == "sigmoid" else logits.softmax(-1)
        choice = scores.detach()
        if c.moe_router_enable_expert_bias:
            choice = choice + self.expert_bias
        idx = group_limited_topk(choice, c.num_experts_per_tok, c.n_group, c.topk_group)
        weight = scores.gather(1, idx)
        if c.norm_topk_prob and c.num_experts_per_tok > 1:
            weight = weight / (weight.sum(-1, keepdim=True) + 1e-20)
        weight = weight * c.routed_scaling_factor

        aux_loss = logits.new_zeros(())
        if c.aux_loss_coef > 0:
            aux_loss = self._balance_loss(scores, idx)
        return Routing(idx, weight, z_loss, aux_loss, logit_absmax)

    def _balance_loss(self, scores: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Switch/Megatron balance loss E * sum_i f_i P_i over this micro-batch."""
        num_experts = scores.shape[-1]
        probs = scores if self.config.score_function == "softmax" else scores / scores.sum(-1, True)
        flat = idx.reshape(-1)  # counted by index_add: `bincount` syncs with the host on CUDA
        counts = probs.new_zeros(num_experts).index_add_(0, flat, probs.new_ones(flat.numel()))
        fraction = counts / idx.numel()
        return num_experts * (fraction * probs.mean(0)).sum()

    def _stochastic_warmup(self, logits: torch.Tensor) -> torch.Tensor:
        """s' = a*s + (1-a)*(mu + sigma*eps) with a = step / W (TR1 eq. 3)."""
        alpha = min(self.step / self.config.srw_warmup_steps, 1.0)
        batch = torch.stack([logits.detach().mean(), logits.detach().std()])
        ema = SRW_MOMENTUM * self.srw_stats + (1 - SRW_MOMENTUM) * batch
        self.srw_stats.copy_(torch.where(torch.isnan(self.srw_stats), batch, ema))
        if alpha >= 1.0:
            return logits
        mean, std = self.srw_stats
        noise = mean + std * torch.randn_like(logits)
        return alpha * logits + (1 - alpha) * noise

    @torch.no_grad()
    def update_expert_bias(self, counts: torch.Tensor) -> None:
        """Aux-loss-free update b += u * sign(mean(c) - c), zero-mean variant optional."""
        c = self.config
        if not c.moe_router_enable_expert_bias or c.bias_update_rate == 0:
            return
        counts = counts.to(self.expert_bias)
        step = torch.sign(counts.mean() - counts)
        if c.bias_zero_mean:
            step = step - step.mean()
        self.expert_bias.add_(c.bias_update_rate * step)
