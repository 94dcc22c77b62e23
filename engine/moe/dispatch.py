"""Dropless token dispatch for the routed experts (moe.md section 6).

`routed_experts(x, idx, weight, gate_up, down, impl)` computes, for every token t,
`sum_j weight[t, j] * SwiGLU_{idx[t, j]}(x[t])` with the fused expert weights
`gate_up` [E, 2f, d] (gate rows first) and `down` [E, d, f]. Three implementations:

- `grouped_mm`: stable-sort the T*k token slots by expert, run two grouped matmuls whose
  groups are the experts' contiguous row ranges, and sum the k slots of each token back.
  No Python loop over experts; on GPU no host synchronisation. One autograd function from
  tokens to tokens with a hand-written backward (`_RoutedExperts`), whose slot-sized
  scratch tensors are kept from step to step (`ScratchPool`).
- `padded_bmm`: the same sort, then rows scattered into an [E, max count, d] buffer and two
  batched matmuls; one host sync (the max count). For builds without grouped_mm.
- `loop`: one masked matmul pair per expert. The test oracle.

The gather into slots and the sum back out are each other's transpose, so both directions of
both are gathers: `index_select` into slots and `sum_slots` back to tokens (on CPU the fused
gather-and-sum `embedding_bag(mode="sum")`). Autograd's default for fancy indexing would
scatter-add rows in the backward pass, which is several times slower on CPU; on CPU the bag
sum is 10x faster than permuting the slot rows and adding them. (`padded_bmm` uses the same
pair as the custom autograd functions `_GatherSlots` and `_ScatterSlots`.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

IMPLS = ("grouped_mm", "padded_bmm", "loop")

_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """`F.grouped_mm(a, b, offs=offsets)` (`torch._grouped_mm` on older torch). Two forms, as
    in the kernel: a [rows, K] with b [E, K, N] gives [rows, N]; a [M, rows] with b [rows, N]
    gives [E, M, N]. (Splitting the experts across threads by hand was measured slower on a
    quiet 2-core CPU than the kernel's own threading: 49 vs 41 ms at the tiny shape.)"""
    return _grouped_mm(a, b, offs=offsets)


@dataclass
class SlotOrder:
    """Where each token slot goes when the slots are sorted by expert.

    `token_of_sorted[i]` is the token of the i-th sorted slot, `slot_of_sorted` its slot
    index t*k + j, `sorted_of_slot` the inverse permutation, `counts[e]` the slots per
    expert and `offsets` their int32 running sum (the grouped_mm group ends).
    """

    token_of_sorted: torch.Tensor
    slot_of_sorted: torch.Tensor
    sorted_of_slot: torch.Tensor
    expert_of_sorted: torch.Tensor
    counts: torch.Tensor
    offsets: torch.Tensor
    top_k: int


def sort_slots(idx: torch.Tensor, num_experts: int) -> SlotOrder:
    """Sort the token slots of `idx` [T, k] by expert (stable, so tokens keep their order)."""
    flat = idx.reshape(-1)
    expert_of_sorted, slot_of_sorted = torch.sort(flat, stable=True)
    sorted_of_slot = torch.empty_like(slot_of_sorted)
    sorted_of_slot[slot_of_sorted] = torch.arange(flat.numel(), device=flat.device)
    # group ends by binary search in the sorted experts: `bincount` on CUDA reads the
    # largest index back to the host, this does not
    experts = torch.arange(num_experts, device=flat.device, dtype=flat.dtype)
    offsets = torch.searchsorted(expert_of_sorted, experts, right=True, out_int32=True)
    return SlotOrder(
        token_of_sorted=slot_of_sorted // idx.shape[1],
        slot_of_sorted=slot_of_sorted,
        sorted_of_slot=sorted_of_slot,
        expert_of_sorted=expert_of_sorted,
        counts=torch.diff(offsets, prepend=offsets.new_zeros(1)).long(),
        offsets=offsets,
        top_k=idx.shape[1],
    )


SLOT_SUMS = ("bag", "gather")


def sum_slots(rows: torch.Tensor, order: SlotOrder, how: str | None = None) -> torch.Tensor:
    """Sorted slot rows [T*k, d] -> per-token sums [T, d], in slot order (deterministic):
    token t's bag is the rows of its k slots.

    `how` (by default "gather" on CUDA, "bag" elsewhere): "bag" is one fused gather-and-sum
    (`embedding_bag`); "gather" gathers the rows into token order, then sums each token's k.
    CUDA's embedding_bag reads an element at a time: 725 us a call at the ling-mini-2.0
    layer (16k tokens, bf16), where the vectorised gather of as many rows took 253 us
    (bench/measured/2026-11-27-h200); `bench/moe_layer.py` times both at every shape."""
    how = how or ("gather" if rows.device.type == "cuda" else "bag")
    bags = order.sorted_of_slot.view(-1, order.top_k)
    if how == "bag":
        return F.embedding_bag(bags, rows, mode="sum")
    if how == "gather":
        return rows.index_select(0, order.sorted_of_slot).view(*bags.shape, -1).sum(1)
    raise ValueError(f"how must be one of {SLOT_SUMS}, got {how!r}")


class _GatherSlots(torch.autograd.Function):
    """x [T, d] -> the sorted slots' rows [T*k, d]; backward sums each token's k slots."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, order: SlotOrder) -> torch.Tensor:
        ctx.order = order
        return x.index_select(0, order.token_of_sorted)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return sum_slots(grad, ctx.order), None


class _ScatterSlots(torch.autograd.Function):
    """Sorted slot rows [T*k, d] -> per-token sums [T, d]; backward copies each token's
    gradient to its k slots."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, order: SlotOrder) -> torch.Tensor:
        ctx.order = order
        return sum_slots(rows, order)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.index_select(0, ctx.order.token_of_sorted), None


def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def grouped_mm_supports(x: torch.Tensor, gate_up: torch.Tensor) -> bool:
    """The kernel exists, takes this dtype on this device, and every row stride is a multiple
    of 16 bytes."""
    # CUDA kernels take bf16 only; the CPU kernel also fp32 and fp16
    on_cuda = x.device.type == "cuda"
    dtypes = (torch.bfloat16,) if on_cuda else (torch.float32, torch.bfloat16, torch.float16)
    return (
        _grouped_mm is not None
        and x.dtype in dtypes
        and all(n * x.element_size() % 16 == 0 for n in (gate_up.shape[1] // 2, gate_up.shape[2]))
    )


class ScratchPool:
    """CPU scratch tensors that keep their memory from one step to the next.

    A fresh CPU tensor of many MB is page-faulted in 4 KiB at a time on first touch, and
    glibc hands blocks over 32 MB back to the kernel when they are freed, so every step paid
    for its dispatch buffers again: gathering the 50 MB of slot rows of the `small` layer
    took 22.6 ms into a fresh tensor and 4.8 ms into a kept one. A tensor is taken, used,
    and given back by whoever uses it last (the backward pass, for what the forward pass
    saves), so it is never in two hands; one not given back is simply freed. CUDA tensors
    bypass the pool: the CUDA caching allocator already keeps freed blocks."""

    KEEP = 16  # tensors kept per shape: every MoE layer's saved slot rows, with room to spare

    def __init__(self) -> None:
        self._free: dict[tuple, list[torch.Tensor]] = {}

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        free = self._free.get((shape, like.dtype, like.device))
        return free.pop() if free else like.new_empty(shape)

    def give(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            if t.device.type == "cpu":
                free = self._free.setdefault((tuple(t.shape), t.dtype, t.device), [])
                if len(free) < self.KEEP:
                    free.append(t)


_POOL = ScratchPool()


class _RoutedExperts(torch.autograd.Function):
    """Tokens -> sorted slot rows -> the experts' SwiGLU as grouped matmuls -> the weighted
    sum of each token's k slots, with a hand-written backward. Every weight gradient comes
    out of one grouped matmul already in the parameter's [E, out, in] layout, and only the
    slot rows and the gate/up activations are kept for it. The slot-sized tensors this code
    allocates itself (the gathers and the elementwise results) live in `_POOL`, and the
    elementwise steps write the two halves of the gate/up gradient straight into one buffer.
    Both directions of the gather and of the sum are gathers (module docstring)."""

    @staticmethod
    def forward(ctx, x, w_sorted, gate_up, down, order):
        slots, f = order.token_of_sorted.numel(), down.shape[-1]
        xs = torch.index_select(x, 0, order.token_of_sorted, out=_POOL.take((slots, x.shape[1]), x))
        h = grouped_mm(xs, gate_up.transpose(-2, -1), order.offsets)
        gate, up = h.chunk(2, dim=-1)
        act_w = torch.ops.aten.silu.out(gate, out=_POOL.take((slots, f), x))
        act_w.mul_(up).mul_(w_sorted.unsqueeze(-1))
        y = sum_slots(grouped_mm(act_w, down.transpose(-2, -1), order.offsets), order)
        _POOL.give(act_w)
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(xs, h, w_sorted, gate_up, down)
            ctx.order = order
        else:
            _POOL.give(xs)
        return y

    @staticmethod
    def backward(ctx, d_y):
        xs, h, w_sorted, gate_up, down = ctx.saved_tensors
        order, offsets = ctx.order, ctx.order.offsets
        slots, f = xs.shape[0], down.shape[-1]
        d_ys = torch.index_select(
            d_y.contiguous(), 0, order.token_of_sorted, out=_POOL.take(tuple(xs.shape), xs)
        )
        gate, up = h.chunk(2, dim=-1)
        w = w_sorted.unsqueeze(-1)
        silu_gate = torch.ops.aten.silu.out(gate, out=_POOL.take((slots, f), xs))
        act = torch.mul(silu_gate, up, out=_POOL.take((slots, f), xs))
        d_act = grouped_mm(d_ys, down, offsets)  # d(act * w); times w below: d(act)
        product = torch.mul(d_act, act, out=_POOL.take((slots, f), xs))
        d_w_sorted = product.sum(-1)
        d_down = grouped_mm(d_ys.T, act.mul_(w), offsets)
        d_act.mul_(w)
        d_h = _POOL.take(tuple(h.shape), h)
        d_gate, d_up = d_h.chunk(2, dim=-1)
        torch.mul(d_act, silu_gate, out=d_up)
        torch.ops.aten.silu_backward.grad_input(d_act.mul_(up), gate, grad_input=d_gate)
        d_gate_up = grouped_mm(d_h.T, xs, offsets)
        d_x = sum_slots(grouped_mm(d_h, gate_up, offsets), order)
        _POOL.give(xs, d_ys, silu_gate, act, product, d_h)
        return d_x, d_w_sorted, d_gate_up, d_down, None


def _experts_padded_bmm(xs, w_sorted, gate_up, down, order):
    num_experts = gate_up.shape[0]
    capacity = int(order.counts.max())  # the one host sync of this path
    starts = order.offsets - order.counts
    position = torch.arange(xs.shape[0], device=xs.device) - starts[order.expert_of_sorted]
    cell = order.expert_of_sorted * capacity + position
    padded = xs.new_zeros(num_experts * capacity, xs.shape[1]).index_copy(0, cell, xs)
    h = torch.bmm(padded.view(num_experts, capacity, -1), gate_up.transpose(-2, -1))
    h = _swiglu(h).reshape(num_experts * capacity, -1).index_select(0, cell)
    h = h * w_sorted.unsqueeze(-1)
    padded_h = h.new_zeros(num_experts * capacity, h.shape[1]).index_copy(0, cell, h)
    out = torch.bmm(padded_h.view(num_experts, capacity, -1), down.transpose(-2, -1))
    return out.reshape(num_experts * capacity, -1).index_select(0, cell)


def routed_experts(
    x: torch.Tensor,
    idx: torch.Tensor,
    weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    impl: str = "grouped_mm",
    order: SlotOrder | None = None,
) -> torch.Tensor:
    """Weighted sum of each token's k experts. x [T, d], idx [T, k] (long), weight [T, k].

    `order` may be passed when the caller already sorted the slots (it also needs the counts).
    `grouped_mm` falls back to `padded_bmm` where `grouped_mm_supports` says no.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "loop":
        return _experts_loop(x, idx, weight, gate_up, down)
    order = order if order is not None else sort_slots(idx, gate_up.shape[0])
    w_sorted = weight.reshape(-1).index_select(0, order.slot_of_sorted).to(x.dtype)
    if impl == "grouped_mm" and grouped_mm_supports(x, gate_up):
        return _RoutedExperts.apply(x.contiguous(), w_sorted, gate_up, down, order)
    xs = _GatherSlots.apply(x, order)
    ys = _experts_padded_bmm(xs, w_sorted, gate_up, down, order)
    return _ScatterSlots.apply(ys, order)


def _experts_loop(x, idx, weight, gate_up, down):
    out = torch.zeros_like(x)
    for e in range(gate_up.shape[0]):
        token, slot = torch.where(idx == e)
        h = _swiglu(x[token] @ gate_up[e].T) @ down[e].T
        out = out.index_add(0, token, h * weight[token, slot].unsqueeze(-1).to(x.dtype))
    return out
