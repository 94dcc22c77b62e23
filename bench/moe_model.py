"""Training throughput of our `tiny` model vs transformers' Glm4MoeForCausalLM (moe.md section 7).

Both models get the same shapes (the tiny preset: d 256, 6 layers, first dense, 64 experts
top-4 in 8 groups keep 4, one shared expert, GQA 4/2, QK-norm, half-rotary RoPE), the same
batch (8 x 256 byte tokens by default; a GPU is busy only with many more) and the same
optimiser (torch's fused AdamW, its fastest on CPU, as the engine's own optimiser step is
fused). Glm4Moe has no training-time MTP, so the headline ratio compares ours with MTP off;
ours with its MTP layer on is reported too. CPU, fp32, 2 threads by default, or a GPU in bf16
with `--device cuda`; one training step of each model per round, round-robin
(bench/side_by_side.py), median over the rounds after warm-up (the minimum is listed too).
Prints one JSON document.

    .venv/bin/python -m bench.moe_model [--rounds N] [--quick] [--device cuda] [--batch B]
                                        [--seq T]
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

from transformers import Glm4MoeForCausalLM  # noqa: E402

from bench.side_by_side import (  # noqa: E402
    add_target_arguments,
    on_target,
    target_from_args,
    time_round_robin,
)
from engine.export import glm4moe_config  # noqa: E402
from engine.moe import MoEModel, param_count, preset  # noqa: E402

BATCH, SEQ = 8, 256  # the tiny-model step


def glm4moe_like(config, experts_implementation: str) -> Glm4MoeForCausalLM:
    """transformers' model of the same shapes, configured as our export configures it."""
    hf_config = glm4moe_config(config)
    hf_config.use_cache = False
    hf_config._attn_implementation = "sdpa"
    hf_config._experts_implementation = experts_implementation
    return Glm4MoeForCausalLM(hf_config)


def trainer(model, forward):
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=True
    )

    def step():
        loss = forward(model)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int,
                        help="timed training steps per model (15 on cpu, 30 on cuda)")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"sequences per step ({BATCH})")
    parser.add_argument("--seq", type=int, default=SEQ, help=f"tokens per sequence ({SEQ})")
    add_target_arguments(parser)
    args = parser.parse_args()
    target = target_from_args(args)
    rounds = 3 if args.quick else args.rounds or (30 if target.on_cuda else 15)
    torch.manual_seed(0)

    config = preset("tiny")
    no_mtp = config.replace(num_nextn_predict_layers=0)
    g = torch.Generator().manual_seed(0)
    shape = (args.batch, args.seq + 1)
    tokens = torch.randint(0, config.vocab_size, shape, generator=g).to(target.device)
    input_ids, labels = tokens[:, :-1], tokens[:, 1:]

    models = {
        name: trainer(on_target(MoEModel(c), target), lambda m: m(input_ids, labels).loss)
        for name, c in (("ours", no_mtp), ("ours_with_mtp", config))
    }
    hf_params = {}
    for impl in ("grouped_mm", "eager"):
        hf = on_target(glm4moe_like(config, impl), target)
        hf_params[impl] = sum(p.numel() for p in hf.parameters())
        # transformers shifts labels itself: give it the unshifted sequence
        models[f"glm4moe_{impl}"] = trainer(
            hf, lambda m: m(input_ids=tokens[:, :-1], labels=tokens[:, :-1]).loss
        )
    time_round_robin(models, 2, target)  # warm-up
    times = {
        name: [ms / 1e3 for ms in t]
        for name, t in time_round_robin(models, rounds, target).items()
    }
    seconds = {name: statistics.median(t) for name, t in times.items()}
    tokens_per_s = {name: args.batch * args.seq / s for name, s in seconds.items()}
    hf_best = max(tokens_per_s["glm4moe_grouped_mm"], tokens_per_s["glm4moe_eager"])
    print(json.dumps({
        "benchmark": "moe_model",
        **target.describe(), "transformers": transformers.__version__, "rounds": rounds,
        "batch": args.batch, "seq": args.seq,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "params": {"ours": param_count(no_mtp), "ours_with_mtp": param_count(config),
                   "glm4moe": hf_params["grouped_mm"]},
        "step_seconds": {k: round(v, 4) for k, v in seconds.items()},
        "step_seconds_min": {k: round(min(t), 4) for k, t in times.items()},
        "tokens_per_s": {k: round(v, 1) for k, v in tokens_per_s.items()},
        "ratios": {
            "model_vs_glm4moe": round(tokens_per_s["ours"] / hf_best, 3),
            "model_with_mtp_vs_glm4moe": round(tokens_per_s["ours_with_mtp"] / hf_best, 3),
        },
    }, indent=2))


if __name__ == "__main__":
    main()
