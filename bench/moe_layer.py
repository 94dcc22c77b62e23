"""MoE layer forward+backward: ours vs transformers' DeepseekV3MoE (moe.md section 7).

Same shapes, same weights (copied), outputs and gradients checked equal before timing (to
1e-6 in fp32; in bf16 to a relative error of 1e-2, what bf16 rounding leaves of two orders of
summation). CPU, fp32, 2 threads by default, or a GPU in bf16 with `--device cuda`; the
implementations are timed round-robin (bench/side_by_side.py); median over the rounds
(minimum listed too).
Also reports our layer's achieved GFLOP/s as a fraction of one dense `torch.mm` with the
same FLOPs, and HF eager's time over that matmul's: the largest speedup over eager that any
implementation of the layer's FLOPs could reach at that shape. Prints one JSON document.

    .venv/bin/python -m bench.moe_layer [--rounds N] [--quick] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.hf_reference import hf_layer_like  # noqa: E402
from bench.side_by_side import (  # noqa: E402
    Target,
    add_target_arguments,
    on_target,
    target_from_args,
    time_round_robin,
)
from engine.moe import preset  # noqa: E402
from engine.moe.model import MoE  # noqa: E402

# name, hidden, experts, top-k, expert width, groups, kept groups, tokens. The ratios are taken
# at the tiny preset's layer and two larger ones of the same family: the small preset's, and
# its routing at hidden 768 (expert width d/4 and 64+ fine-grained experts, as in every Ling
# preset).
SHAPES = [
    ("tiny", 256, 64, 4, 64, 8, 4, 2048),
    ("large_small_preset", 512, 64, 6, 128, 8, 4, 4096),
    ("large_d768_e64", 768, 64, 6, 192, 8, 4, 4096),
]
# Reported, not in the ratios: a coarse-grained layer outside the Ling family (32 experts,
# top-2), where transformers' eager loop is within 3x of one dense matmul of the layer's
# FLOPs (`hf_eager_over_dense_mm`), so no implementation can be 3x faster than it there.
OTHER_SHAPES = [
    ("coarse_d384_e32", 384, 32, 2, 128, 4, 2, 4096),
]
HF_IMPLS = ("eager", "grouped_mm")


def build(shape, target: Target):
    _, d, e, k, f, groups, kept, _ = shape
    config = preset("tiny").replace(
        hidden_size=d, num_experts=e, num_experts_per_tok=k, moe_intermediate_size=f,
        n_group=groups, topk_group=kept, num_shared_experts=1,
    )
    torch.manual_seed(0)
    ours = MoE(config)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0.0, 0.02)
    hf = {impl: on_target(hf_layer_like(ours, impl), target) for impl in HF_IMPLS}
    return on_target(ours, target), hf


def step(layer, x, grad):
    """One forward+backward; returns the output and the input gradient."""
    x = x.detach().requires_grad_()
    out = layer(x)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(grad)
    for p in layer.parameters():
        p.grad = None
    return out.detach(), x.grad


def layer_flops(shape) -> float:
    _, d, e, k, f, _, _, tokens = shape
    router, routed, shared = 2 * tokens * d * e, 6 * tokens * k * d * f, 6 * tokens * d * f
    forward = router + routed + shared
    return 3.0 * forward  # backward is twice the forward


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value.float() - reference.float()).norm() / reference.float().norm()).item()


def bench_shape(shape, rounds: int, target: Target) -> dict:
    name, d, *_, tokens = shape
    ours, hf = build(shape, target)
    g = torch.Generator().manual_seed(1)
    x, grad = (torch.randn(1, tokens, d, generator=g).to(target.device, target.dtype)
               for _ in range(2))

    reference_out, reference_dx = step(ours, x, grad)
    max_diff, relative = {}, {}
    for impl, layer in hf.items():
        out, dx = step(layer, x, grad)
        max_diff[impl] = max((out - reference_out).abs().max().item(),
                             (dx - reference_dx).abs().max().item())
        relative[impl] = max(relative_error(out, reference_out), relative_error(dx, reference_dx))
        if target.dtype == torch.float32:
            torch.testing.assert_close(out, reference_out, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(dx, reference_dx, atol=1e-6, rtol=1e-5)
        else:
            assert relative[impl] <= 1e-2, f"{impl}: relative error {relative[impl]:.2e} > 1e-2"

    flops = layer_flops(shape)
    dense_n = max(64, round(flops / (2 * tokens * d) / 64) * 64)
    a = torch.randn(tokens, d, device=target.device, dtype=target.dtype)
    b = torch.randn(d, dense_n, device=target.device, dtype=target.dtype)
    fns = {"ours": lambda: step(ours, x, grad)}
    for impl, layer in hf.items():
        fns[f"hf_{impl}"] = lambda layer=layer: step(layer, x, grad)
    fns["dense_mm"] = lambda: torch.mm(a, b)
    time_round_robin(fns, 2, target)  # warm-up
    times = time_round_robin(fns, rounds, target)
    ms = {name: statistics.median(t) for name, t in times.items()}
    ours_gflops = flops / ms["ours"] / 1e6
    dense_gflops = 2 * tokens * d * dense_n / ms["dense_mm"] / 1e6
    hf_best = min(ms[f"hf_{impl}"] for impl in HF_IMPLS)
    return {
        "shape": dict(zip(["hidden", "experts", "top_k", "expert_ffn", "groups", "kept_groups",
                           "tokens"], shape[1:], strict=True)),
        "ms": {k: round(v, 2) for k, v in ms.items()},
        "ms_min": {k: round(min(t), 2) for k, t in times.items()},
        "max_abs_diff_vs_ours": max_diff,
        "relative_error_vs_ours": relative,
        "ours_gflops": round(ours_gflops, 1),
        "dense_mm_gflops": round(dense_gflops, 1),
        "dense_mm_shape": [tokens, d, dense_n],
        "speedup_vs_hf_best": round(hf_best / ms["ours"], 3),
        "speedup_vs_hf_eager": round(ms["hf_eager"] / ms["ours"], 3),
        "fraction_of_dense_mm": round(ours_gflops / dense_gflops, 3),
        # the most any implementation could gain over eager here: the layer's FLOPs at
        # dense-matmul speed
        "hf_eager_over_dense_mm": round(ms["hf_eager"] / ms["dense_mm"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="timed rounds per shape (15 on cpu, 50 on cuda)")
    parser.add_argument("--quick", action="store_true", help="tiny shape only, 3 rounds")
    parser.add_argument("--tokens", type=int,
                        help="tokens per call at every shape (default: each shape's own; a GPU "
                             "needs many more than the CPU shapes have to be busy)")
    add_target_arguments(parser)
    args = parser.parse_args()
    target = target_from_args(args)

    def sized(shapes):
        return [(*shape[:-1], args.tokens) for shape in shapes] if args.tokens else shapes

    shapes = sized(SHAPES[:1] if args.quick else SHAPES)
    rounds = 3 if args.quick else args.rounds or (50 if target.on_cuda else 15)
    results = {shape[0]: bench_shape(shape, rounds, target) for shape in shapes}
    others = {} if args.quick else {
        shape[0]: bench_shape(shape, rounds, target) for shape in sized(OTHER_SHAPES)
    }
    large = [results[s[0]] for s in SHAPES[1:] if s[0] in results]
    ratios = {"layer_vs_hf_best_tiny": results["tiny"]["speedup_vs_hf_best"]}
    if large:
        ratios["layer_vs_hf_best_large"] = large[0]["speedup_vs_hf_best"]
        ratios["layer_vs_dense_mm_large"] = min(r["fraction_of_dense_mm"] for r in large)
    ratios["layer_vs_hf_eager_min"] = min(r["speedup_vs_hf_eager"] for r in results.values())
    print(json.dumps({
        "benchmark": "moe_layer",
        **target.describe(), "transformers": transformers.__version__, "rounds": rounds,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "ratios": ratios,
        "shapes": results,
        "other_shapes": others,
    }, indent=2))


if __name__ == "__main__":
    main()
