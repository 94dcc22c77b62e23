"""The cross-entropy of a linear head over the vocabulary without materialising the logits.

At the Ling vocabulary (157,184) the logits of a 16k-token step in fp32 are 10 GB, their
log-softmax and gradient as much again: the largest activations of a step. Here the tokens
go through the head a chunk at a time: the forward keeps only each token's logsumexp, the
backward recomputes a chunk's logits, turns them into their gradient in place and multiplies
it out into the gradients of the hidden states and of the head's weight. One chunk's fp32
logits are bounded by `LOGITS_CHUNK_BYTES`; the price is the head's forward matmul done twice.
The loss and gradients are those of `F.cross_entropy` over the materialised logits (the mean
over the tokens whose label is not `IGNORE_INDEX`), including its precision: the logits are
computed in the weight's dtype and taken to fp32 for the softmax, as `F.linear(...).float()`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
# what one chunk's fp32 logits may take: 426 tokens at the Ling vocabulary
LOGITS_CHUNK_BYTES = 256 << 20


def chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk whose fp32 logits over `vocab_size` fit `LOGITS_CHUNK_BYTES`."""
    return max(1, LOGITS_CHUNK_BYTES // (4 * vocab_size))


def linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int
) -> torch.Tensor:
    """Mean cross-entropy of the logits `h @ weight.T` (h [N, D], weight [V, D]) against
    `labels` [N], ignoring `IGNORE_INDEX`, computed `chunk` tokens at a time."""
    return linear_cross_entropy_tokens(h, weight, labels, chunk)[0]


def linear_cross_entropy_tokens(
    h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`linear_cross_entropy`, and each token's loss [N] beside it (0 where ignored; no
    gradient): what a per-sample or per-source loss is read from at no extra cost."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    return _LinearCrossEntropy.apply(h.contiguous(), weight.contiguous(), labels, chunk)


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, rows: slice) -> torch.Tensor:
    return F.linear(h[rows], weight).float()


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, labels, chunk):
        kept = labels != IGNORE_INDEX
        targets = torch.where(kept, labels, 0)[:, None]
        lse = torch.empty(len(labels), dtype=torch.float32, device=h.device)
        losses = torch.empty_like(lse)
        for start in range(0, len(labels), chunk):
            rows = slice(start, start + chunk)
            logits = _chunk_logits(h, weight, rows)
            torch.logsumexp(logits, -1, out=lse[rows])
            torch.sub(lse[rows], logits.gather(1, targets[rows]).squeeze(1), out=losses[rows])
        count = kept.sum()
        ctx.save_for_backward(h, weight, targets, kept, lse, count)
        ctx.chunk = chunk
        token_losses = losses.where(kept, 0)
        ctx.mark_non_differentiable(token_losses)
        return token_losses.sum() / count, token_losses

    @staticmethod
    def backward(ctx, grad_loss, _grad_token_losses):
        h, weight, targets, kept, lse, count = ctx.saved_tensors
        want_h, want_weight = ctx.needs_input_grad[:2]
        # d loss / d logits = (softmax - one_hot(target)) * grad_loss / count on kept tokens
        scale = kept * (grad_loss / count)
        grad_h = torch.empty_like(h) if want_h else None
        # the weight's gradient sums over every chunk: in fp32, as one matmul would
        grad_weight = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
                       if want_weight else None)
        product = (torch.empty_like(weight)
                   if want_weight and weight.dtype != torch.float32 else None)
        for start in range(0, len(h), ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            d_logits = _chunk_logits(h, weight, rows).sub_(lse[rows, None]).exp_()
            d_logits.scatter_add_(1, targets[rows], lse.new_full(targets[rows].shape, -1.0))
            d_logits = d_logits.mul_(scale[rows, None]).to(h.dtype)
            if want_h:
                torch.mm(d_logits, weight, out=grad_h[rows])
            if product is not None:
                grad_weight.add_(torch.mm(d_logits.T, h[rows], out=product))
            elif want_weight:
                grad_weight.addmm_(d_logits.T, h[rows])
        if want_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_h, grad_weight, None, None
