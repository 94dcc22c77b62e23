"""Every dispatch path computes what the per-expert loop computes, forwards and backwards."""

from __future__ import annotations

import pytest
import torch

from engine.moe.dispatch import (
    _POOL,
    grouped_mm_supports,
    routed_experts,
    sort_slots,
    sum_slots,
)

torch.set_num_threads(1)


def random_problem(seed, tokens, experts, k, d, f, dtype=torch.float32, skewed=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, d, generator=g).to(dtype)
    if skewed:  # half of the experts never chosen: empty groups everywhere
        scores = torch.rand(tokens, experts, generator=g)
        scores[:, experts // 2 :] = -1
    else:
        scores = torch.rand(tokens, experts, generator=g)
    idx = scores.topk(k, dim=-1).indices
    weight = torch.rand(tokens, k, generator=g)
    gate_up = (torch.randn(experts, 2 * f, d, generator=g) * 0.05).to(dtype)
    down = (torch.randn(experts, d, f, generator=g) * 0.05).to(dtype)
    return x, idx, weight, gate_up, down


def run(impl, x, idx, weight, gate_up, down):
    leaves = [t.clone().requires_grad_() for t in (x, weight, gate_up, down)]
    out = routed_experts(leaves[0], idx, leaves[1], leaves[2], leaves[3], impl)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out)
    out.backward(grad_out)
    return [out.detach()] + [t.grad for t in leaves]


GRAD_NAMES = ["out", "d_x", "d_weight", "d_gate_up", "d_down"]

SHAPES = [
    # tokens, experts, k, d, f, skewed
    (1, 8, 2, 16, 8, False),  # a single token
    (1, 64, 4, 32, 16, False),
    (3, 16, 1, 16, 8, False),
    (37, 16, 3, 32, 16, True),  # experts with no tokens
    (128, 64, 4, 64, 32, False),
    (256, 8, 8, 48, 24, False),  # k == E: every expert gets every token
    (200, 32, 6, 64, 16, True),
    (64, 16, 2, 20, 12, False),  # widths grouped_mm cannot take: padded fallback
]


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """grouped_mm splits the experts across threads on CPU: check both ways."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("impl", ["grouped_mm", "padded_bmm"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])))
def test_dispatch_equals_loop_in_outputs_and_gradients_fp32(impl, shape, threads):
    *dims, skewed = shape
    for seed in range(2):
        problem = random_problem(seed, *dims, skewed=skewed)
        expected = run("loop", *problem)
        actual = run(impl, *problem)
        for name, a, e in zip(GRAD_NAMES, actual, expected, strict=True):
            torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6, msg=f"{name} differs")


def test_all_tokens_on_one_expert(threads):
    x, _, weight, gate_up, down = random_problem(0, 64, 8, 1, 16, 8)
    idx = torch.full((64, 1), 5)
    for a, e in zip(run("grouped_mm", x, idx, weight, gate_up, down),
                    run("loop", x, idx, weight, gate_up, down), strict=True):
        torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("impl", ["grouped_mm", "padded_bmm"])
def test_dispatch_equals_loop_in_bf16(impl, threads):
    problem = random_problem(0, 256, 32, 4, 64, 32, dtype=torch.bfloat16, skewed=True)
    expected = run("loop", *problem)
    actual = run(impl, *problem)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a.float(), e.float(), atol=2e-2, rtol=2e-2)


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value.cpu().float() - reference).norm() / reference.norm()).item()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])))
def test_on_cuda_bf16_dispatch_equals_the_fp32_loop(shape):
    """The CUDA grouped_mm kernels take bf16 only; the oracle runs in fp32 on the CPU on the
    same (bf16-rounded) inputs, and bf16 keeps about 3 significant digits."""
    *dims, skewed = shape
    problem = random_problem(0, *dims, dtype=torch.bfloat16, skewed=skewed)
    expected = run("loop", *(t.float() if t.is_floating_point() else t for t in problem))
    on_gpu = [t.cuda() for t in problem]
    assert grouped_mm_supports(on_gpu[0], on_gpu[3]) == (dims[3] % 8 == 0 and dims[4] % 8 == 0)
    actual = run("grouped_mm", *on_gpu)
    for name, a, e in zip(GRAD_NAMES, actual, expected, strict=True):
        assert relative_error(a, e) <= 2e-2, f"{name} differs"


def test_grouped_mm_kernel_is_used_for_aligned_fp32_and_bf16():
    gate_up = torch.empty(4, 2 * 16, 32)
    assert grouped_mm_supports(torch.empty(1, 32), gate_up)
    assert grouped_mm_supports(torch.empty(1, 32, dtype=torch.bfloat16), gate_up)
    assert not grouped_mm_supports(torch.empty(1, 32), torch.empty(4, 2 * 6, 32))


def test_slot_order_is_a_stable_sort_with_counts_and_offsets():
    idx = torch.tensor([[2, 0], [0, 3], [2, 1]])
    order = sort_slots(idx, num_experts=5)
    assert order.expert_of_sorted.tolist() == [0, 0, 1, 2, 2, 3]
    assert order.token_of_sorted.tolist() == [0, 1, 2, 0, 2, 1]
    assert order.counts.tolist() == [2, 1, 2, 1, 0]
    assert order.offsets.tolist() == [2, 3, 5, 6, 6]
    assert order.slot_of_sorted[order.sorted_of_slot].tolist() == list(range(6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_slot_sums_add_each_tokens_k_rows_in_slot_order(dtype):
    """The fused bag sum (CPU's) and the gather-then-sum (CUDA's) give the same sums."""
    idx = torch.tensor([[2, 0, 1], [0, 3, 2], [2, 1, 4], [4, 4, 0]])
    order = sort_slots(idx, num_experts=5)
    rows = torch.randn(idx.numel(), 8, generator=torch.Generator().manual_seed(3)).to(dtype)
    in_slot_order = rows[order.sorted_of_slot].view(4, 3, 8)
    expected = in_slot_order[:, 0] + in_slot_order[:, 1] + in_slot_order[:, 2]
    for how in ("bag", "gather"):
        torch.testing.assert_close(sum_slots(rows, order, how), expected)
    with pytest.raises(ValueError, match="how must be one of"):
        sum_slots(rows, order, "scatter")


def test_unknown_impl_is_rejected_by_name():
    with pytest.raises(ValueError, match="impl must be one of"):
        routed_experts(*random_problem(0, 4, 4, 2, 8, 8), impl="magic")


def test_the_dispatch_buffers_of_one_step_serve_the_next():
    x, idx, weight, gate_up, down = random_problem(0, 128, 16, 4, 32, 16)
    run("grouped_mm", x, idx, weight, gate_up, down)
    kept = {id(t) for free in _POOL._free.values() for t in free}
    run("grouped_mm", x, idx, weight, gate_up, down)
    assert kept == {id(t) for free in _POOL._free.values() for t in free}


def test_a_forward_between_forward_and_backward_leaves_the_pending_gradients_right():
    first = random_problem(0, 64, 8, 2, 32, 16)
    second = random_problem(1, 64, 8, 2, 32, 16)
    expected = run("loop", *first)
    leaves = [t.clone().requires_grad_() for t in (first[0], first[2], first[3], first[4])]
    out = routed_experts(leaves[0], first[1], leaves[1], leaves[2], leaves[3])
    run("grouped_mm", *second)  # a whole step of another batch, with grad
    with torch.no_grad():
        routed_experts(second[0], second[1], second[2], second[3], second[4])
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(7)))
    for name, a, e in zip(GRAD_NAMES, [out.detach()] + [t.grad for t in leaves], expected,
                          strict=True):
        torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6, msg=f"{name} differs")


def test_a_retained_graph_whose_buffers_went_to_later_steps_is_never_silently_wrong():
    """Its second backward either raises (a saved buffer was overwritten: autograd's
    version check) or gives the right gradients (it was not)."""
    x, idx, weight, gate_up, down = random_problem(0, 64, 8, 2, 32, 16)
    expected = run("loop", x, idx, weight, gate_up, down)
    leaves = [t.clone().requires_grad_() for t in (x, weight, gate_up, down)]
    out = routed_experts(leaves[0], idx, *leaves[1:])
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    out.backward(grad_out, retain_graph=True)
    for seed in range(1, 4):  # later steps take the buffers it gave back, and write them
        run("grouped_mm", *random_problem(seed, 64, 8, 2, 32, 16))
    for t in leaves:
        t.grad = None
    try:
        out.backward(grad_out)
    except RuntimeError as error:
        assert "modified by an inplace operation" in str(error)
        return
    for name, a, e in zip(GRAD_NAMES[1:], [t.grad for t in leaves], expected[1:], strict=True):
        torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6, msg=f"{name} differs")
