"""Routers: group-limited selection, weight normalisation, balancing by bias and by loss."""

from __future__ import annotations

import pytest
import torch

from engine.moe import preset
from engine.moe.router import Router, group_limited_topk

torch.set_num_threads(1)

LING1 = dict(
    router_mode="ling1", score_function="softmax", moe_router_enable_expert_bias=False,
    n_group=1, topk_group=1, routed_scaling_factor=1.0, aux_loss_coef=0.015,
)


def router(seed=0, **changes):
    torch.manual_seed(seed)
    config = preset("tiny").replace(**changes)
    r = Router(config)
    torch.nn.init.normal_(r.weight, 0.0, 0.02)
    return r


def test_group_limited_topk_never_selects_outside_the_kept_groups():
    g = torch.Generator().manual_seed(0)
    choice = torch.rand(500, 64, generator=g)
    idx = group_limited_topk(choice, k=4, n_group=8, topk_group=3)
    group_score = choice.view(500, 8, 8).topk(2, dim=-1).values.sum(-1)
    kept = group_score.topk(3, dim=-1).indices
    assert (idx // 8).unsqueeze(-1).eq(kept.unsqueeze(1)).any(-1).all()
    # and within the kept groups it is the plain top-k
    masked = choice.view(500, 8, 8).clone()
    keep = torch.zeros(500, 8, dtype=torch.bool).scatter_(1, kept, True)
    masked[~keep] = float("-inf")
    expected = masked.view(500, 64).topk(4, dim=-1).indices
    assert torch.equal(idx.sort(-1).values, expected.sort(-1).values)


def test_ling2_weights_sum_to_the_scaling_factor_and_ignore_the_bias():
    r = router()
    r.expert_bias.copy_(torch.linspace(-1, 1, 64))
    x = torch.randn(300, 256)
    routing = r(x)
    torch.testing.assert_close(routing.weight.sum(-1), torch.full((300,), 2.5))
    # weights come from the raw sigmoid scores of the chosen experts, not the biased ones
    scores = torch.sigmoid(x @ r.weight.T).gather(1, routing.idx)
    torch.testing.assert_close(routing.weight, 2.5 * scores / scores.sum(-1, keepdim=True))
    # the bias does steer the choice toward the favoured experts
    assert routing.idx.float().mean() > 40


def test_ling1_weights_are_renormalised_softmax_top_k():
    r = router(**LING1)
    x = torch.randn(100, 256)
    routing = r(x)
    torch.testing.assert_close(routing.weight.sum(-1), torch.ones(100))
    top = (x @ r.weight.T).softmax(-1).topk(4, dim=-1)
    assert torch.equal(routing.idx.sort(-1).values, top.indices.sort(-1).values)


def test_z_loss_is_the_mean_squared_logsumexp():
    r = router()
    x = torch.randn(50, 256)
    expected = torch.logsumexp(x @ r.weight.T, dim=-1).square().mean()
    torch.testing.assert_close(r(x).z_loss, expected)


def test_balance_loss_is_one_at_perfect_balance_and_larger_when_skewed():
    r = router(**LING1)
    with torch.no_grad():
        r.weight.zero_()  # uniform probabilities
    tokens = 64
    idx_balanced = torch.arange(tokens * 4).view(tokens, 4) % 64
    uniform = torch.full((tokens, 64), 1 / 64)
    assert r._balance_loss(uniform, idx_balanced).item() == pytest.approx(1.0)
    skewed_probs = torch.zeros(tokens, 64)
    skewed_probs[:, :4] = 0.25
    idx_skewed = torch.arange(4).expand(tokens, 4)
    assert r._balance_loss(skewed_probs, idx_skewed).item() == pytest.approx(16.0)


def test_bias_update_moves_a_skewed_load_toward_balance():
    r = router(bias_update_rate=1e-2)
    g = torch.Generator().manual_seed(0)
    # inputs aligned with a few experts' router rows: those experts win almost every token
    favoured = r.weight.detach()[:6].sum(0)
    x = torch.randn(2048, 256, generator=g) + 40 * favoured

    def max_violation():
        counts = torch.bincount(r(x).idx.flatten(), minlength=64).float()
        return (counts.max() / counts.mean() - 1).item(), counts

    before, counts = max_violation()
    for _ in range(300):
        r.update_expert_bias(counts)
        after, counts = max_violation()
    assert before > 5
    assert after < before / 3
    assert r.expert_bias.mean().abs() < 1e-6


def test_bias_update_is_a_no_op_when_the_config_disables_it():
    r = router(**LING1)
    r.update_expert_bias(torch.arange(64.0))
    assert r.expert_bias.abs().sum() == 0


def test_stochastic_routing_warmup_randomises_early_and_vanishes_after_w_steps():
    r = router(srw_warmup_steps=100, **LING1)
    x = torch.randn(400, 256)
    plain = router(**(LING1 | {"srw_warmup_steps": 0}))(x).idx.sort(-1).values
    r.step = 0
    early = r(x).idx.sort(-1).values
    assert (early != plain).any(-1).float().mean() > 0.5
    r.step = 100
    assert torch.equal(r(x).idx.sort(-1).values, plain)
    with torch.no_grad():  # evaluation never adds noise
        r.step = 0
        assert torch.equal(r(x).idx.sort(-1).values, plain)
