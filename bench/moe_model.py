"""Training throughput of our `tiny` model vs transformers' Glm4MoeForCausalLM (moe.md section 7).

Both models get the same shapes (the tiny preset: d 256, 6 layers, first dense, 64 experts
top-4 in 8 groups keep 4, one shared expert, GQA 4/2, QK-norm, half-rotary RoPE), the same
batch (8 x 256 byte tokens by default; a GPU is busy only with many more; `--accumulate N`
micro-batches of it per optimizer step, as a real run's batch of millions of tokens spreads
the optimizer's cost) and the same
optimiser (torch's fused AdamW, its fastest on CPU, as the engine's own optimiser step is
fused, after clipping the gradients' global norm at 1.0, as the engine does). Glm4Moe has
no training-time MTP, so the headline ratio compares ours with MTP off;
ours with its MTP layer on is reported too. CPU, fp32, 2 threads by default, or a GPU in bf16
with `--device cuda`; one training step of each model per round, round-robin
(bench/side_by_side.py), median over the rounds after warm-up (the minimum is listed too).
Prints one JSON document.

At a published model's shapes (`--preset ling-mini-2.0`, a GPU's setting) the model keeps
`--layers` of its layers (by default as many as fit the GPU's memory with both models and
their optimizers resident), ours trains with the engine's own sharded optimizer (PaRO's
`ShardedDataParallel` on one rank: bf16 parameters, fp32 master weights and moments), and
transformers' model with its `grouped_mm` experts only (its eager loop over 256 experts is
no contender). Each model's MFU is its model FLOPs per token (`flops_per_token`) times its
tokens/s over the peak of one large dense matmul measured in the same run.

    .venv/bin/python -m bench.moe_model [--rounds N] [--quick] [--device cuda] [--batch B]
                                        [--seq T] [--accumulate N] [--preset NAME] [--layers N]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import Glm4MoeForCausalLM  # noqa: E402

from bench.side_by_side import (  # noqa: E402
    Target,
    add_target_arguments,
    on_target,
    target_from_args,
    time_round_robin,
    write_profile,
)
from engine.export import glm4moe_config  # noqa: E402
from engine.horing import Topology  # noqa: E402
from engine.moe import MoEConfig, MoEModel, param_count, preset  # noqa: E402
from engine.moe.config import PRESETS, flops_per_token  # noqa: E402
from engine.paro import ShardedDataParallel  # noqa: E402
from engine.ports import free_port  # noqa: E402

BATCH, SEQ = 8, 256  # the tiny-model step
LR, BETAS, WEIGHT_DECAY, GRAD_CLIP = 1e-3, (0.9, 0.95), 0.1, 1.0
# GPU bytes per parameter with both models resident: ours under the sharded optimizer (bf16
# parameter, its gradient a view of the bf16 flat gradient buffer, fp32 master and two
# moments: 16) and transformers' under fused AdamW in bf16 (parameter, gradient, two moments:
# 8); per token of a step, what its activations take in one layer (a guess with room) and what
# transformers' logits take (bf16, their fp32 copy for the loss, its gradient and theirs: 12
# bytes per vocabulary entry; ours never holds them whole, engine.moe.loss).
BYTES_PER_PARAM = 16 + 8
ACTIVATION_BYTES_PER_TOKEN_LAYER = 256 << 10
LOGIT_BYTES = 12


def glm4moe_like(config, experts_implementation: str) -> Glm4MoeForCausalLM:
    """transformers' model of the same shapes, configured as our export configures it."""
    hf_config = glm4moe_config(config)
    hf_config.use_cache = False
    hf_config._attn_implementation = "sdpa"
    hf_config._experts_implementation = experts_implementation
    return Glm4MoeForCausalLM(hf_config)


def trainer(model, forward, accumulate: int) -> Callable[[], float]:
    """An optimizer step after `accumulate` micro-batches, each loss scaled to its share."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, fused=True
    )

    def step():
        for _ in range(accumulate):
            loss = forward(model) / accumulate
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def sharded_trainer(model: MoEModel, input_ids, labels, accumulate: int) -> Callable[[], float]:
    """Ours as the engine trains it: PaRO's sharded optimizer, here on a one-rank group."""
    if not dist.is_initialized():  # one group for both of our variants
        backend = "nccl" if next(model.parameters()).is_cuda else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1)
    dp = ShardedDataParallel(model, Topology(1, 1).init_groups(), "NNN", lr=LR, betas=BETAS,
                             weight_decay=WEIGHT_DECAY, grad_accum=accumulate)

    def step():
        for _ in range(accumulate):
            loss = dp.forward_backward(input_ids, labels).loss
        dp.step(LR, GRAD_CLIP)
        return loss.item()

    return step


def fitting_layers(config: MoEConfig, tokens: int, target: Target) -> int:
    """The most layers of `config` whose two models, optimizers and one step of `tokens`
    fit 90% of the GPU's memory (the estimate above)."""
    budget = 0.9 * torch.cuda.get_device_properties(target.device).total_memory

    def need(layers: int) -> float:
        return (param_count(config.replace(num_hidden_layers=layers)) * BYTES_PER_PARAM
                + tokens * (layers * ACTIVATION_BYTES_PER_TOKEN_LAYER
                            + config.vocab_size * LOGIT_BYTES))

    layers = 1
    while layers < config.num_hidden_layers and need(layers + 1) <= budget:
        layers += 1
    return layers


def dense_peak_tflops(target: Target, rounds: int) -> float:
    """The device's dense matmul throughput in the target dtype: the median of `rounds`
    products of two 8192-square matrices (2048 on a CPU)."""
    n = 8192 if target.on_cuda else 2048
    a, b = (torch.randn(n, n, device=target.device, dtype=target.dtype) for _ in range(2))
    times = time_round_robin({"mm": lambda: torch.mm(a, b)}, rounds + 2, target)["mm"][2:]
    return 2 * n**3 / (statistics.median(times) / 1e3) / 1e12


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int,
                        help="timed training steps per model (15 on cpu, 30 on cuda)")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"sequences per step ({BATCH})")
    parser.add_argument("--seq", type=int, default=SEQ, help=f"tokens per sequence ({SEQ})")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                        help="the model's shapes (tiny)")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="micro-batches of --batch sequences per optimizer step (1): as a "
                             "real run's large batch spreads the optimizer's cost")
    parser.add_argument("--layers", type=int,
                        help="keep this many of the preset's layers (default: all on a CPU, "
                             "as many as fit on a GPU)")
    parser.add_argument("--ours-optimizer", choices=("fused_adamw", "sharded"),
                        default="fused_adamw",
                        help="torch's fused AdamW, as transformers' model gets (default), or "
                             "the engine's sharded optimizer with fp32 master weights")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="also write torch.profiler's table of our training step here")
    parser.add_argument("--hf-impls", default="grouped_mm,eager",
                        help="transformers' expert implementations to time (grouped_mm,eager)")
    add_target_arguments(parser)
    args = parser.parse_args()
    args.hf_impls = args.hf_impls.split(",")
    if not set(args.hf_impls) <= {"grouped_mm", "eager"}:
        parser.error(f"--hf-impls: grouped_mm and/or eager, got {','.join(args.hf_impls)}")
    if args.accumulate < 1:
        parser.error("--accumulate must be at least 1")
    if args.layers is not None and args.layers < 1:
        parser.error("--layers must be at least 1")
    return args


def models_to_time(args, config: MoEConfig, tokens: torch.Tensor,
                   target: Target) -> tuple[dict, int]:
    """One training step of each model, keyed by name; and transformers' parameter count.
    The models are built on the target (a GPU initialises billions of parameters in no time)."""
    input_ids, labels = tokens[:, :-1], tokens[:, 1:]
    variants = [("ours", config.replace(num_nextn_predict_layers=0))]
    if config.num_nextn_predict_layers:
        variants.append(("ours_with_mtp", config))
    models = {}
    for name, c in variants:
        with torch.device(target.device):
            model = on_target(MoEModel(c), target)
        models[name] = (
            sharded_trainer(model, input_ids, labels, args.accumulate)
            if args.ours_optimizer == "sharded"
            else trainer(model, lambda m: m(input_ids, labels).loss, args.accumulate)
        )
    for impl in args.hf_impls:
        with torch.device(target.device):
            hf = on_target(glm4moe_like(config, impl), target)
        hf_params = sum(p.numel() for p in hf.parameters())
        # transformers shifts labels itself: give it the unshifted sequence
        models[f"glm4moe_{impl}"] = trainer(
            hf, lambda m: m(input_ids=tokens[:, :-1], labels=tokens[:, :-1]).loss,
            args.accumulate)
    return models, hf_params


def fitted_models(args, config: MoEConfig, tokens: torch.Tensor,
                  target: Target) -> tuple[MoEConfig, dict, int]:
    """The models with `--layers` layers, or on a GPU as many as the estimate allows, each
    warmed up; on a GPU one layer fewer at a time until a warm-up step of each fits."""
    layers = args.layers or (fitting_layers(config, args.batch * args.seq, target)
                             if target.on_cuda else config.num_hidden_layers)
    while True:
        sized = config.replace(num_hidden_layers=layers,
                               first_k_dense_replace=min(config.first_k_dense_replace, layers))
        try:
            models, hf_params = models_to_time(args, sized, tokens, target)
            time_round_robin(models, 2, target)  # warm-up
            return sized, models, hf_params
        except torch.OutOfMemoryError:
            if not target.on_cuda or layers == 1:
                raise
        # past the except block, its traceback no longer holds the models' tensors
        layers -= 1
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(target.device)


def main() -> None:
    args = parse_args()
    target = target_from_args(args)
    rounds = 3 if args.quick else args.rounds or (30 if target.on_cuda else 15)
    step_tokens = args.accumulate * args.batch * args.seq
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    config = preset(args.preset)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), generator=g)
    config, models, hf_params = fitted_models(args, config, tokens.to(target.device), target)

    peak = dense_peak_tflops(target, rounds)
    started = time.perf_counter()
    times = {name: [ms / 1e3 for ms in t]
             for name, t in time_round_robin(models, rounds, target).items()}
    timed_s = time.perf_counter() - started
    if args.profile is not None:
        write_profile(models["ours"], target, args.profile / f"moe_model_{args.preset}.txt")
    seconds = {name: statistics.median(t) for name, t in times.items()}
    tokens_per_s = {name: step_tokens / s for name, s in seconds.items()}
    hf_best = max(tokens_per_s[f"glm4moe_{impl}"] for impl in args.hf_impls)
    flops = {name: flops_per_token(config if name == "ours_with_mtp"
                                   else config.replace(num_nextn_predict_layers=0), args.seq)
             for name in models}
    ratios = {"model_vs_glm4moe": round(tokens_per_s["ours"] / hf_best, 3)}
    if "ours_with_mtp" in models:
        ratios["model_with_mtp_vs_glm4moe"] = round(tokens_per_s["ours_with_mtp"] / hf_best, 3)
    print(json.dumps({
        "benchmark": "moe_model",
        **target.describe(), "transformers": transformers.__version__, "rounds": rounds,
        "preset": args.preset, "layers": config.num_hidden_layers, "batch": args.batch,
        "seq": args.seq, "accumulate": args.accumulate,
        "ours_optimizer": args.ours_optimizer,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "params": {"ours": param_count(config.replace(num_nextn_predict_layers=0)),
                   "ours_with_mtp": param_count(config), "glm4moe": hf_params},
        "peak_memory_gb": (round(torch.cuda.max_memory_allocated(target.device) / 2**30, 1)
                           if target.on_cuda else None),
        "timed_s": round(timed_s, 1),  # the timed rounds of every model
        "step_seconds": {k: round(v, 4) for k, v in seconds.items()},
        "step_seconds_min": {k: round(min(t), 4) for k, t in times.items()},
        "tokens_per_s": {k: round(v, 1) for k, v in tokens_per_s.items()},
        "dense_peak_tflops": round(peak, 2),
        "model_tflops_per_token": {k: v / 1e12 for k, v in flops.items()},
        "mfu": {k: round(flops[k] * tokens_per_s[k] / (peak * 1e12), 4) for k in models},
        "ratios": ratios,
    }, indent=2))


if __name__ == "__main__":
    main()
