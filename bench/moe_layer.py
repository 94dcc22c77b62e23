"""MoE layer forward+backward: ours vs torchtitan's and transformers' layers (moe.md section 7).

Same shapes, same weights (copied), outputs and gradients checked against ours before timing:
transformers' DeepseekV3MoE (its `eager` loop and `grouped_mm` experts) to 1e-6 in fp32, or to
a relative error of 1e-2 in bf16 (what bf16 rounding leaves of two orders of summation);
torchtitan's MoE always to 1e-2, as it runs its experts in bf16 whatever the input's dtype.
Also timed: one dense `torch.mm` with the layer's FLOPs, the limit a MoE layer's grouped
matmuls approach. Beside them, `slot_sum_ms`: the two ways the dispatch can add each
token's k expert rows back up (`engine.moe.dispatch.sum_slots`). The implementations take
turns, one call each per round (bench/side_by_side.py); median over the rounds (minimum
listed too).

Two settings:
- by default the CPU shapes (fp32, 2 threads; `--device cuda` runs them in bf16): the tiny
  preset's layer and larger ones of the Ling family, at a few thousand tokens;
- `--shape ling-mini-2.0 --shape ling-flash-2.0` those models' MoE layers (hidden 2048 or
  4096, 256 experts, top-8, expert width 512 or 1024, one shared expert) at `--tokens`
  8192,16384,32768 per call: a GPU's setting (`--device cuda`); any preset's layer is taken.

Prints one JSON document.

    .venv/bin/python -m bench.moe_layer [--rounds N] [--quick] [--device cuda]
        [--shape ling-mini-2.0 ...] [--tokens 8192,16384,32768]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import transformers
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.hf_reference import hf_layer_like  # noqa: E402
from bench.side_by_side import (  # noqa: E402
    Target,
    add_target_arguments,
    on_target,
    target_from_args,
    time_round_robin,
    write_profile,
)
from engine.moe import PRESETS, MoEConfig, cast_parameters, preset  # noqa: E402
from engine.moe.dispatch import SLOT_SUMS, sort_slots, sum_slots  # noqa: E402
from engine.moe.model import MoE  # noqa: E402

try:
    from bench.titan_reference import titan_layer_like
    TORCHTITAN = importlib.metadata.version("torchtitan")
except (ImportError, AttributeError) as error:
    # torchtitan reaches into torch's private modules; on a torch it does not fit, the other
    # figures are still worth the GPU time: the document says why torchtitan's are missing
    titan_layer_like, TORCHTITAN = None, f"not importable: {type(error).__name__}: {error}"

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
PRODUCTION_TOKENS = (8192, 16384, 32768)
HEADLINE_TOKENS = 16384  # where the production ratios are taken
HF_IMPLS = ("eager", "grouped_mm")
BF16_RELATIVE = 1e-2


def shape_config(shape: tuple) -> MoEConfig:
    _, d, e, k, f, groups, kept, _ = shape
    return preset("tiny").replace(
        hidden_size=d, num_experts=e, num_experts_per_tok=k, moe_intermediate_size=f,
        n_group=groups, topk_group=kept, num_shared_experts=1,
    )


def build(config: MoEConfig, target: Target) -> tuple[MoE, nn.Module | None, nn.Module]:
    """Ours, torchtitan's and transformers' layers on the target, with ours's weights: built
    there and cast at once (a flash-sized layer is 3.2B parameters)."""
    torch.manual_seed(0)
    with torch.device(target.device):
        ours = MoE(config)
        with torch.no_grad():
            for p in ours.parameters():
                p.normal_(0.0, config.initializer_range)
        cast_parameters(ours, target.dtype)
        titan = on_target(titan_layer_like(ours), target) if titan_layer_like else None
        # one module for both of transformers' implementations: it reads its config's
        # `_experts_implementation` at each call
        hf = on_target(hf_layer_like(ours, HF_IMPLS[0]), target)
    return ours, titan, hf


def step(layer, x, grad):
    """One forward+backward; returns the output and the input gradient."""
    x = x.detach().requires_grad_()
    out = layer(x)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(grad)
    for p in layer.parameters():
        p.grad = None
    return out.detach(), x.grad


def implementations(ours, titan, hf, x, grad) -> dict:
    def hf_step(impl: str):
        def call():
            hf.experts.config._experts_implementation = impl
            return step(hf, x, grad)
        return call

    fns = {"ours": lambda: step(ours, x, grad)}
    if titan is not None:
        fns["torchtitan"] = lambda: step(titan, x, grad)
    return fns | {f"hf_{impl}": hf_step(impl) for impl in HF_IMPLS}


def layer_flops(config: MoEConfig, tokens: int) -> float:
    c = config
    d, e, k, f = c.hidden_size, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size
    router, routed = 2 * tokens * d * e, 6 * tokens * k * d * f
    forward = router + routed + 6 * tokens * d * f * c.num_shared_experts
    return 3.0 * forward  # backward is twice the forward


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value.float() - reference.float()).norm() / reference.float().norm()).item()


def check_against_ours(fns: dict, target: Target) -> tuple[dict, dict]:
    """Each implementation's largest absolute and relative difference from ours (output and
    input gradient); raises where one is beyond its tolerance."""
    reference_out, reference_dx = fns["ours"]()
    max_diff, relative = {}, {}
    for name, fn in fns.items():
        if name == "ours":
            continue
        out, dx = fn()
        max_diff[name] = max((out - reference_out).abs().max().item(),
                             (dx - reference_dx).abs().max().item())
        relative[name] = max(relative_error(out, reference_out), relative_error(dx, reference_dx))
        if target.dtype == torch.float32 and name != "torchtitan":
            torch.testing.assert_close(out, reference_out, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(dx, reference_dx, atol=1e-6, rtol=1e-5)
        else:
            assert relative[name] <= BF16_RELATIVE, (
                f"{name}: relative error {relative[name]:.2e} > {BF16_RELATIVE}")
    return max_diff, relative


def slot_sum_ms(config: MoEConfig, tokens: int, rounds: int, target: Target) -> dict:
    """Median ms of each way `sum_slots` can add the k slot rows of every token back up (the
    dispatch's combine, twice a step), on this shape's rows: which one the device should take."""
    g = torch.Generator().manual_seed(2)
    idx = torch.rand(tokens, config.num_experts, generator=g).topk(
        config.num_experts_per_tok, dim=-1).indices.to(target.device)
    order = sort_slots(idx, config.num_experts)
    rows = torch.randn(idx.numel(), config.hidden_size, generator=g).to(target.device,
                                                                         target.dtype)
    fns = {how: (lambda how=how: sum_slots(rows, order, how)) for how in SLOT_SUMS}
    time_round_robin(fns, 2, target)  # warm-up
    times = time_round_robin(fns, rounds, target)
    return {how: round(statistics.median(t), 3) for how, t in times.items()}


def bench_shape(name: str, config: MoEConfig, tokens: int, rounds: int, target: Target,
                profile_dir: Path | None = None) -> dict:
    d = config.hidden_size
    ours, titan, hf = build(config, target)
    g = torch.Generator().manual_seed(1)
    x, grad = (torch.randn(1, tokens, d, generator=g).to(target.device, target.dtype)
               for _ in range(2))
    fns = implementations(ours, titan, hf, x, grad)
    max_diff, relative = check_against_ours(fns, target)

    flops = layer_flops(config, tokens)
    dense_n = max(64, round(flops / (2 * tokens * d) / 64) * 64)
    a = torch.randn(tokens, d, device=target.device, dtype=target.dtype)
    b = torch.randn(d, dense_n, device=target.device, dtype=target.dtype)
    fns["dense_mm"] = lambda: torch.mm(a, b)
    time_round_robin(fns, 2, target)  # warm-up
    times = time_round_robin(fns, rounds, target)
    if profile_dir is not None:
        write_profile(fns["ours"], target, profile_dir / f"moe_layer_{name}@{tokens}.txt")
    ms = {impl: statistics.median(t) for impl, t in times.items()}
    ours_gflops = flops / ms["ours"] / 1e6
    dense_gflops = 2 * tokens * d * dense_n / ms["dense_mm"] / 1e6
    hf_best = min(ms[f"hf_{impl}"] for impl in HF_IMPLS)
    return {
        "shape": {"hidden": d, "experts": config.num_experts,
                  "top_k": config.num_experts_per_tok,
                  "expert_ffn": config.moe_intermediate_size, "groups": config.n_group,
                  "kept_groups": config.topk_group, "shared": config.num_shared_experts,
                  "tokens": tokens},
        "ms": {k: round(v, 3) for k, v in ms.items()},
        "ms_min": {k: round(min(t), 3) for k, t in times.items()},
        "max_abs_diff_vs_ours": max_diff,
        "relative_error_vs_ours": relative,
        "ours_gflops": round(ours_gflops, 1),
        "dense_mm_gflops": round(dense_gflops, 1),
        "dense_mm_shape": [tokens, d, dense_n],
        **({"speedup_vs_torchtitan": round(ms["torchtitan"] / ms["ours"], 3)}
           if "torchtitan" in ms else {}),
        "speedup_vs_hf_best": round(hf_best / ms["ours"], 3),
        "speedup_vs_hf_eager": round(ms["hf_eager"] / ms["ours"], 3),
        "fraction_of_dense_mm": round(ours_gflops / dense_gflops, 3),
        # the most any implementation could gain over eager here: the layer's FLOPs at
        # dense-matmul speed
        "hf_eager_over_dense_mm": round(ms["hf_eager"] / ms["dense_mm"], 3),
        "slot_sum_ms": slot_sum_ms(config, tokens, rounds, target),
    }


def production_ratios(results: dict[tuple[str, int], dict]) -> dict:
    """The issue's figures at each published layer, at HEADLINE_TOKENS per call."""
    ratios = {}
    for (name, tokens), result in results.items():
        if tokens == HEADLINE_TOKENS:
            if "speedup_vs_torchtitan" in result:
                ratios[f"layer_vs_torchtitan_{name}"] = result["speedup_vs_torchtitan"]
            ratios[f"layer_vs_hf_best_{name}"] = result["speedup_vs_hf_best"]
            ratios[f"layer_vs_dense_mm_{name}"] = result["fraction_of_dense_mm"]
    return ratios


def cpu_shape_ratios(results: dict) -> dict:
    tiny = results["tiny"]
    ratios = {"layer_vs_hf_best_tiny": tiny["speedup_vs_hf_best"]}
    if "speedup_vs_torchtitan" in tiny:
        ratios["layer_vs_torchtitan_tiny"] = tiny["speedup_vs_torchtitan"]
    large = [results[s[0]] for s in SHAPES[1:] if s[0] in results]
    if large:
        ratios["layer_vs_hf_best_large"] = large[0]["speedup_vs_hf_best"]
        ratios["layer_vs_dense_mm_large"] = min(r["fraction_of_dense_mm"] for r in large)
    ratios["layer_vs_hf_eager_min"] = min(r["speedup_vs_hf_eager"] for r in results.values())
    return ratios


def parse_tokens(text: str) -> tuple[int, ...]:
    try:
        tokens = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}") from None
    if not tokens or min(tokens) < 1:
        raise argparse.ArgumentTypeError("token counts must be positive")
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="timed rounds per shape (15 on cpu, 30 on cuda)")
    parser.add_argument("--quick", action="store_true", help="tiny shape only, 3 rounds")
    parser.add_argument("--shape", action="append", choices=sorted(PRESETS),
                        help="a preset's MoE layer instead of the CPU shapes (repeatable): "
                             "ling-mini-2.0 and ling-flash-2.0 on a GPU")
    parser.add_argument("--tokens", type=parse_tokens,
                        help="tokens per call, comma-separated (default: each CPU shape's own; "
                             f"{','.join(map(str, PRODUCTION_TOKENS))} with --shape)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="also write torch.profiler's table of our layer at each shape here")
    add_target_arguments(parser)
    args = parser.parse_args()
    if args.tokens and len(args.tokens) > 1 and not args.shape:
        parser.error("--tokens: one count for the CPU shapes (several with --shape)")
    target = target_from_args(args)
    rounds = 3 if args.quick else args.rounds or (30 if target.on_cuda else 15)

    if args.shape:
        runs = {(name, tokens): bench_shape(name, preset(name), tokens, rounds, target,
                                            args.profile)
                for name in args.shape for tokens in args.tokens or PRODUCTION_TOKENS}
        results = {f"{name}@{tokens}": result for (name, tokens), result in runs.items()}
        ratios, others = production_ratios(runs), {}
    else:
        def timed(shapes, profile_dir=None):
            return {s[0]: bench_shape(s[0], shape_config(s), args.tokens[0] if args.tokens
                                      else s[-1], rounds, target, profile_dir)
                    for s in shapes}

        results = timed(SHAPES[:1] if args.quick else SHAPES, args.profile)
        others = {} if args.quick else timed(OTHER_SHAPES)
        ratios = cpu_shape_ratios(results)
    print(json.dumps({
        "benchmark": "moe_layer",
        **target.describe(), "transformers": transformers.__version__, "torchtitan": TORCHTITAN,
        "rounds": rounds, "load_average_1m": round(os.getloadavg()[0], 2),
        "ratios": ratios,
        "shapes": results,
        "other_shapes": others,
    }, indent=2))


if __name__ == "__main__":
    main()
