"""The chunked cross-entropy: the loss and gradients of `F.cross_entropy` over materialised
logits (bench.loss_memory's `materialised_loss`, the engine's loss before), without them."""

from __future__ import annotations

import copy

import pytest
import torch

from bench.loss_memory import materialise, materialised_loss
from engine.moe import MoEModel, preset
from engine.moe.loss import IGNORE_INDEX, LOGITS_CHUNK_BYTES, chunk_tokens, linear_cross_entropy
from engine.moe.model import LMHead

torch.set_num_threads(1)
FP32 = dict(rtol=1e-5, atol=1e-7)
TOKENS, DIM, VOCAB = 50, 24, 300


def head_and_batch(norm_head: bool, dtype: torch.dtype = torch.float32, seed: int = 0):
    torch.manual_seed(seed)
    head = LMHead(DIM, VOCAB, norm_head).to(dtype)
    h = torch.randn(TOKENS, DIM).to(dtype).requires_grad_()
    labels = torch.randint(0, VOCAB, (TOKENS,))
    labels[::4] = IGNORE_INDEX
    return head, h, labels


def loss_and_grads(loss_of, head, h, labels):
    h.grad = head.weight.grad = None
    loss = loss_of(h, labels)
    loss.backward()
    return loss.detach(), h.grad, head.weight.grad


@pytest.mark.parametrize("norm_head", [True, False])
@pytest.mark.parametrize("chunk", [1, 7, TOKENS, 4 * TOKENS])  # 7: a last chunk of 1 token
def test_loss_and_gradients_are_the_materialised_ones(norm_head, chunk):
    head, h, labels = head_and_batch(norm_head)
    head.chunk_tokens = chunk
    got = loss_and_grads(head, head, h, labels)
    want = loss_and_grads(lambda x, y: materialised_loss(head, x, y), head, h, labels)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **FP32)


def test_bf16_weights_give_the_materialised_loss_and_gradients():
    head, h, labels = head_and_batch(norm_head=True, dtype=torch.bfloat16)
    head.chunk_tokens = 7
    got = loss_and_grads(head, head, h, labels)
    want = loss_and_grads(lambda x, y: materialised_loss(head, x, y), head, h, labels)
    assert got[0].dtype == torch.float32 and got[2].dtype == torch.bfloat16
    torch.testing.assert_close(got[0], want[0], **FP32)  # fp32 softmax over the same logits
    for g, w in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(g, w, rtol=1.6e-2, atol=1e-5)


def test_a_frozen_head_gives_the_hidden_states_their_gradient_only():
    head, h, labels = head_and_batch(norm_head=False)
    head.chunk_tokens = 7
    head.weight.requires_grad_(False)
    loss_of_frozen = loss_and_grads(head, head, h, labels)
    want = loss_and_grads(lambda x, y: materialised_loss(head, x, y), head, h, labels)
    assert loss_of_frozen[2] is None
    torch.testing.assert_close(loss_of_frozen[1], want[1], **FP32)


def test_no_tensor_of_tokens_by_vocabulary_is_kept_for_the_backward():
    head, h, labels = head_and_batch(norm_head=True)
    head.chunk_tokens = 7
    saved: list[int] = []

    def keep(tensor):
        saved.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        head(h, labels)
    # the head's weight is the largest (VOCAB x DIM, DIM < TOKENS); one chunk's logits are
    # not kept either
    assert max(saved) == VOCAB * DIM


def test_the_default_chunk_bounds_the_fp32_logits():
    vocab = preset("ling-mini-2.0").vocab_size
    row = 4 * vocab  # one token's fp32 logits
    assert chunk_tokens(vocab) * row <= LOGITS_CHUNK_BYTES < (chunk_tokens(vocab) + 1) * row
    assert chunk_tokens(1 << 40) == 1  # a vocabulary past the budget still goes a token at a time
    assert LMHead(8, vocab, norm_head=False).chunk_tokens == chunk_tokens(vocab)


def test_a_chunk_below_one_is_refused():
    head, h, labels = head_and_batch(norm_head=False)
    with pytest.raises(ValueError, match="chunk must be at least 1, got 0"):
        linear_cross_entropy(h, head.weight, labels, 0)


def nano_pair(**changes):
    """The nano model with the chunked loss in chunks of 5 tokens, and a copy of it with the
    materialised loss."""
    torch.manual_seed(0)
    model = MoEModel(preset("nano").replace(**changes))
    model.lm_head.chunk_tokens = 5
    return model, materialise(copy.deepcopy(model))


def nano_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (2, 17), generator=g)
    labels = ids[:, 1:].clone()
    labels[0, :3] = IGNORE_INDEX
    return ids[:, :-1], labels


def test_the_lm_and_mtp_heads_losses_and_every_gradient_are_the_materialised_ones():
    chunked, materialised = nano_pair(norm_head=True, num_nextn_predict_layers=2)
    ids, labels = nano_batch(0)
    outs = [model(ids, labels) for model in (chunked, materialised)]
    for out in outs:
        out.loss.backward()
    torch.testing.assert_close(outs[0].ce_loss, outs[1].ce_loss, **FP32)
    torch.testing.assert_close(outs[0].loss, outs[1].loss, **FP32)
    grads = [dict(m.named_parameters()) for m in (chunked, materialised)]
    assert grads[0]["lm_head.weight"].grad.abs().sum() > 0
    for name, p in grads[0].items():
        torch.testing.assert_close(p.grad, grads[1][name].grad, **FP32, msg=name)


def test_nano_trains_as_with_the_materialised_loss():
    losses = []
    for model in nano_pair():
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        run = []
        for _ in range(4):
            out = model(*nano_batch(0))
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            run.append(out.loss.item())
        losses.append(run)
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert losses[0][-1] < losses[0][0]
