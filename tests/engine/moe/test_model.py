"""The model: published sizes, the training loop's interface, losses, and that it learns."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.moe import ModelOutput, MoEModel, cast_parameters, param_count, preset
from engine.moe.model import RMSNorm, apply_rotary, rotary_tables

torch.set_num_threads(1)


def batch(config, batch_size=2, seq=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch_size, seq + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


@pytest.mark.parametrize(
    "name, total_b, active_b",
    [("ling-lite", 16.8, 2.75), ("ling-mini-2.0", 16.26, 1.43), ("ling-flash-2.0", 102.89, 6.15)],
)
def test_parameter_counts_match_the_published_totals(name, total_b, active_b):
    config = preset(name)
    assert param_count(config) / 1e9 == pytest.approx(total_b, abs=0.005)
    assert param_count(config, active=True) / 1e9 == pytest.approx(active_b, abs=0.005)


@pytest.mark.parametrize(
    "name", ["nano", "tiny", "small", "ling-lite", "ling-mini-2.0", "ling-flash-2.0"]
)
@pytest.mark.parametrize("changes", [
    {}, {"tie_word_embeddings": True, "use_qkv_bias": True, "use_bias": True},
    {"use_qk_norm": False, "num_shared_experts": 2, "first_k_dense_replace": 0},
    {"num_nextn_predict_layers": 2},
])
def test_the_count_from_the_config_is_the_models_own(name, changes):
    config = preset(name).replace(**changes)
    with torch.device("meta"):
        model = MoEModel(config)
    assert param_count(config) == sum(p.numel() for p in model.parameters())
    idle = config.num_experts - config.num_experts_per_tok
    routed = sum(m.experts.gate_up[0].numel() + m.experts.down[0].numel()
                 for m in model.moe_layers)
    assert param_count(config, active=True) == param_count(config) - idle * routed


def test_ling_mini_active_non_embedding_parameters_are_789m():
    config = preset("ling-mini-2.0")
    embedding_and_head = 2 * config.vocab_size * config.hidden_size
    active_non_embedding = param_count(config, active=True) - embedding_and_head
    assert active_non_embedding / 1e6 == pytest.approx(789, abs=0.5)


def test_published_presets_build_on_the_meta_device():
    with torch.device("meta"):
        model = MoEModel(preset("ling-lite"))
    assert model.lm_head.weight.is_meta
    assert len(model.moe_layers) == 28  # Ling 1: every layer is MoE


def test_forward_returns_loss_ce_and_logits_on_request():
    config = preset("nano")
    model = MoEModel(config)
    ids, labels = batch(config)
    out = model(ids, labels)
    assert isinstance(out, ModelOutput) and out.logits is None
    assert out.loss.requires_grad and not out.ce_loss.requires_grad
    # at init the prediction is near uniform over the vocabulary
    assert out.ce_loss.item() == pytest.approx(torch.log(torch.tensor(256.0)).item(), abs=0.1)
    logits = model(ids, labels, return_logits=True).logits
    assert logits.shape == (2, 16, config.vocab_size)


def test_loss_adds_the_weighted_mtp_loss_in_training_mode_only():
    config = preset("nano").replace(z_loss_coef=0.0)
    model = MoEModel(config)
    ids, labels = batch(config)
    out = model(ids, labels)
    assert out.loss.item() == pytest.approx(out.ce_loss.item() * 1.1, rel=0.02)
    model.eval()
    out = model(ids, labels)
    assert out.loss.item() == pytest.approx(out.ce_loss.item(), abs=1e-6)


def test_ignored_labels_do_not_count():
    config = preset("nano")
    model = MoEModel(config).eval()
    ids, labels = batch(config)
    masked = labels.clone()
    masked[:, 8:] = -100
    full = model(ids, labels, return_logits=True)
    part = model(ids, masked)
    expected = torch.nn.functional.cross_entropy(
        full.logits[:, :8].flatten(0, 1), labels[:, :8].flatten()
    )
    torch.testing.assert_close(part.ce_loss, expected)


def test_attention_is_causal():
    config = preset("nano")
    model = MoEModel(config).eval()
    ids, labels = batch(config)
    changed = ids.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % config.vocab_size
    a = model(ids, labels, return_logits=True).logits
    b = model(changed, labels, return_logits=True).logits
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_routing_counts_are_kept_for_training_forwards_only():
    config = preset("nano")
    model = MoEModel(config)
    ids, labels = batch(config)
    model(ids, labels)
    counts = model.routing_counts()
    n_moe = config.num_hidden_layers - config.first_k_dense_replace + 1  # + the MTP layer
    assert counts.shape == (n_moe, config.num_experts) and counts.dtype == torch.float32
    assert (counts.sum(1) == ids.numel() * config.num_experts_per_tok).all()
    with torch.no_grad():
        model(ids, labels)
    torch.testing.assert_close(model.routing_counts(), counts)
    model.reset_routing_counts()
    assert model.routing_counts().sum() == 0


def test_expert_stats_describe_each_moe_layer():
    config = preset("nano")
    model = MoEModel(config)
    counts = torch.tensor([[4.0, 4, 4, 4, 4, 4, 4, 4], [16.0, 0, 0, 0, 8, 8, 0, 0]])
    model(*batch(config))
    balanced, skewed = model.expert_stats(counts)
    assert balanced["max_violation"] == 0 and balanced["dead_experts"] == 0
    assert balanced["load_entropy"] == pytest.approx(1.0)
    assert skewed["tokens_per_expert"] == [16, 0, 0, 0, 8, 8, 0, 0]
    assert skewed["max_violation"] == pytest.approx(16 / 4 - 1)
    assert skewed["dead_experts"] == 5
    assert 0 < skewed["load_entropy"] < 1
    assert skewed["z_loss"] > 0 and skewed["router_logit_max"] > 0
    assert set(skewed["expert_bias"]) == {"mean", "std", "absmax"}


def test_update_expert_bias_rejects_counts_of_the_wrong_shape():
    model = MoEModel(preset("nano"))
    with pytest.raises(ValueError, match=r"counts must have shape \[2, 8\]"):
        model.update_expert_bias(torch.zeros(3, 8))


def test_update_expert_bias_moves_bias_toward_underused_experts():
    model = MoEModel(preset("nano"))
    counts = torch.tensor([[10.0, 0, 0, 0, 0, 0, 0, 6]] * 2)
    model.update_expert_bias(counts)
    bias = model.moe_layers[0].router.expert_bias
    assert bias[0] < 0 and bias[1] > 0
    assert bias.mean().abs() < 1e-7  # zero-mean variant


def test_bad_inputs_name_the_argument():
    config = preset("nano")
    model = MoEModel(config)
    ids, labels = batch(config)
    with pytest.raises(ValueError, match="labels shape"):
        model(ids, labels[:, :-1])
    with pytest.raises(ValueError, match="input_ids must be"):
        model(ids[0], labels[0])
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        MoEModel(config.replace(num_experts_per_tok=9))


def nano_config(router: str):
    """The nano preset (ling2), or nano with Ling-1's router, head and attention."""
    config = preset("nano")
    if router == "ling1":
        config = config.replace(
            router_mode="ling1", score_function="softmax", moe_router_enable_expert_bias=False,
            n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_head=True,
            use_qk_norm=False, partial_rotary_factor=1.0, num_nextn_predict_layers=0,
            aux_loss_coef=0.015, z_loss_coef=1e-4, srw_warmup_steps=10,
        )
    return config


@pytest.mark.parametrize("router", ["ling2", "ling1"])
def test_loss_falls_on_a_repeated_batch(router):
    config = nano_config(router)
    torch.manual_seed(0)
    model = MoEModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids, labels = batch(config, batch_size=4, seq=32)
    first = None
    for step in range(40):
        model.set_step(step)
        out = model(ids, labels)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.update_expert_bias(model.routing_counts())
        model.reset_routing_counts()
        first = first if first is not None else out.ce_loss.item()
    assert out.ce_loss.item() < 0.3 * first


@pytest.mark.parametrize("shape", [(4, 16, 32), (2, 8, 3, 16)], ids=["hidden", "per_head"])
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
def test_rms_norm_equals_torch_in_outputs_and_gradients(shape, contiguous):
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(shape[-1], eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(shape[-1], generator=g) + 0.5)
    source = torch.randn(*shape[:-1], 2 * shape[-1], generator=g)
    # a strided input, as the q/k heads split out of the fused projection are
    x = source[..., : shape[-1]] if not contiguous else source[..., : shape[-1]].contiguous()
    grad = torch.randn(shape, generator=g)
    results = []
    for fn in (norm, lambda t: F.rms_norm(t, (shape[-1],), norm.weight, norm.eps)):
        leaf = x.detach().clone().requires_grad_()
        out = fn(leaf)
        out.backward(grad)
        results.append((out.detach(), leaf.grad, norm.weight.grad.clone()))
        norm.weight.grad = None
    for name, ours, torch_ in zip(("out", "d_x", "d_weight"), *results, strict=True):
        torch.testing.assert_close(ours, torch_, atol=1e-6, rtol=1e-5, msg=f"{name} differs")


def rotate_half_reference(x, cos, sin):
    """The textbook form (transformers' apply_rotary_pos_emb) on the first rotary dims."""
    rotary_dim = 2 * cos.shape[-1]
    cos, sin = torch.cat([cos, cos], -1)[:, None, :], torch.cat([sin, sin], -1)[:, None, :]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    first, second = rot.chunk(2, dim=-1)
    return torch.cat([rot * cos + torch.cat([-second, first], dim=-1) * sin, rest], dim=-1)


@pytest.mark.parametrize("partial", [0.5, 1.0])
def test_rotary_equals_the_textbook_rotate_half_in_outputs_and_gradients(partial):
    config = preset("nano").replace(head_dim=16, partial_rotary_factor=partial)
    cos, sin = rotary_tables(config, 12, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 12, 5, 16, generator=g)
    grad = torch.randn(2, 12, 3, 16, generator=g)
    results = []
    for fn in (apply_rotary, rotate_half_reference):
        leaf = qkv.detach().clone().requires_grad_()
        out = fn(leaf[:, :, :3], cos, sin)  # strided heads, as split from the fused projection
        out.backward(grad)
        results.append((out.detach(), leaf.grad))
    for name, ours, reference in zip(("out", "d_x"), *results, strict=True):
        torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-6, msg=f"{name} differs")


def test_bf16_parameters_keep_the_routing_state_in_fp32():
    config = preset("nano")
    model = cast_parameters(MoEModel(config), torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in model.buffers()} == {torch.float32}
    input_ids, labels = batch(config, batch_size=4, seq=64)
    out = model(input_ids, labels)
    out.loss.backward()
    assert out.logits is None and out.loss.isfinite()
    assert all(p.grad.dtype == torch.bfloat16 for p in model.parameters())
    # every token's k choices counted exactly, in every MoE layer
    counts = model.routing_counts()
    assert counts.sum(-1).tolist() == [4 * 64 * config.num_experts_per_tok] * len(counts)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("router", ["ling2", "ling1"])
def test_a_bf16_training_step_on_cuda_never_waits_for_the_host(router):
    """Routing, dispatch, losses and their gradients are queued without one device-to-host
    copy (torch raises on any synchronising call in this mode)."""
    model = cast_parameters(MoEModel(nano_config(router)).cuda(), torch.bfloat16)
    input_ids, labels = (t.cuda() for t in batch(model.config))
    model(input_ids, labels).loss.backward()  # kernels load and autotune outside the check
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(input_ids, labels).loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())



def test_with_the_document_mask_a_documents_logits_ignore_what_is_packed_beside_it():
    torch.manual_seed(0)
    model = MoEModel(preset("nano")).eval()
    doc, before, after = (torch.randint(0, 256, (1, n)) for n in (9, 5, 4))
    alone = model(doc, doc, return_logits=True, doc_ids=torch.zeros(1, 9, dtype=torch.long))
    packed_ids = torch.cat([before, doc, after], 1)
    doc_ids = torch.tensor([[0] * 5 + [1] * 9 + [2] * 4])
    packed = model(packed_ids, packed_ids, return_logits=True, doc_ids=doc_ids)
    torch.testing.assert_close(packed.logits[:, 5:14], alone.logits, atol=1e-5, rtol=1e-5)
    # without the mask the neighbour shows, and one document's mask is the causal default
    unmasked = model(packed_ids, packed_ids, return_logits=True)
    assert not torch.allclose(unmasked.logits[:, 5:14], alone.logits, atol=1e-3)
    torch.testing.assert_close(model(doc, doc, return_logits=True).logits, alone.logits)


def test_each_rows_loss_is_reported_beside_the_mean():
    model = MoEModel(preset("nano"))
    input_ids, labels = batch(model.config, batch_size=3)
    out = model(input_ids, labels)
    assert out.sample_ce.shape == (3,) and not out.sample_ce.requires_grad
    torch.testing.assert_close(out.sample_ce.mean(), out.ce_loss)
