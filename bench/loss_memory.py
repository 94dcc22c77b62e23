"""Peak memory and time of a training step with the loss over materialised logits (the engine's
loss before the chunked cross-entropy) and with the engine's chunked loss (engine.moe.loss).

At the ling-mini-2.0 vocabulary with a small hidden size the logits are most of a step's
memory, so two parts are measured, each variant of each in a fresh process:

    head    the LM head (NormHead) and its loss alone: forward and backward of `--tokens`
            hidden states against their labels (every tenth ignored)
    model   a forward and backward of the tiny preset with the ling-mini-2.0 vocabulary and
            `--hidden`, MTP on (so two heads), `--tokens` in sequences of `--seq`

The peak is what a part's steps add to the memory held after its setup (model, inputs):
on a CPU the process's peak RSS (VmHWM, reset by /proc/self/clear_refs once set up) less its
RSS then; on a GPU `torch.cuda.max_memory_allocated` less the memory allocated then. A
step's time is the median of `--rounds` steps after one warm-up. Prints one JSON document.

    .venv/bin/python -m bench.loss_memory [--tokens N] [--hidden D] [--seq T] [--rounds N]
                                          [--device cuda]
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.side_by_side import (  # noqa: E402
    Target,
    add_target_arguments,
    on_target,
    target_from_args,
)
from engine.moe import MoEModel, preset  # noqa: E402
from engine.moe.config import PRESETS  # noqa: E402
from engine.moe.loss import IGNORE_INDEX, chunk_tokens  # noqa: E402
from engine.moe.model import LMHead  # noqa: E402

VOCAB = PRESETS["ling-mini-2.0"].vocab_size
TOKENS, HIDDEN, SEQ, ROUNDS = 2048, 256, 1024, 3
PARTS = ("head", "model")
VARIANTS = ("materialised", "chunked")


def materialised_loss(head: LMHead, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The head's loss as the engine computed it before: every logit, in fp32, then
    `F.cross_entropy` (the reference the chunked loss is tested against)."""
    logits = head.logits(h).reshape(-1, head.out_features).float()
    return F.cross_entropy(logits, labels.reshape(-1), ignore_index=IGNORE_INDEX)


def materialise(model: nn.Module) -> nn.Module:
    """The model with each of its heads' losses computed by `materialised_loss`."""
    for module in model.modules():
        if isinstance(module, LMHead):
            module.forward = functools.partial(materialised_loss, module)
    return model


def head_step(args: argparse.Namespace, target: Target, variant: str) -> Callable[[], float]:
    torch.manual_seed(0)
    head = on_target(LMHead(args.hidden, VOCAB, norm_head=True), target)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(args.tokens, args.hidden, generator=g).to(target.device, target.dtype)
    h.requires_grad_()
    labels = torch.randint(0, VOCAB, (args.tokens,), generator=g).to(target.device)
    labels[::10] = IGNORE_INDEX
    loss_of = head if variant == "chunked" else functools.partial(materialised_loss, head)

    def step() -> float:
        loss = loss_of(h, labels)
        loss.backward()
        h.grad = head.weight.grad = None
        return loss.item()

    return step


def model_step(args: argparse.Namespace, target: Target, variant: str) -> Callable[[], float]:
    config = preset("tiny").replace(vocab_size=VOCAB, hidden_size=args.hidden)
    torch.manual_seed(0)
    with torch.device(target.device):
        model = on_target(MoEModel(config), target)
    if variant == "materialised":
        materialise(model)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (args.tokens // args.seq, args.seq + 1), generator=g)
    tokens = tokens.to(target.device)

    def step() -> float:
        loss = model(tokens[:, :-1], tokens[:, 1:]).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss.item()

    return step


def _status_bytes(field: str) -> int:
    kib = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    return int(kib.group(1)) << 10


def measure(args: argparse.Namespace, target: Target) -> dict:
    """One part's variant in this process: the peak its steps add and their median time."""
    step = {"head": head_step, "model": model_step}[args.part](args, target, args.variant)
    if target.on_cuda:
        settled = torch.cuda.memory_allocated(target.device)
        torch.cuda.reset_peak_memory_stats(target.device)
    else:
        settled = _status_bytes("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    seconds = []
    for _ in range(args.rounds + 1):
        started = time.perf_counter()
        loss = step()
        target.sync()
        seconds.append(time.perf_counter() - started)
    peak = (torch.cuda.max_memory_allocated(target.device) if target.on_cuda
            else _status_bytes("VmHWM"))
    return {"peak_bytes": peak - settled, "step_seconds": statistics.median(seconds[1:]),
            "loss": loss}


def in_fresh_process(part: str, variant: str) -> dict:
    """`measure` of one part's variant in a new interpreter, with this run's arguments."""
    command = [sys.executable, "-m", "bench.loss_memory", *sys.argv[1:],
               "--part", part, "--variant", variant]
    done = subprocess.run(command, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    if done.returncode:
        raise SystemExit(f"{part} {variant} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=TOKENS, help=f"tokens per step ({TOKENS})")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help=f"hidden size ({HIDDEN})")
    parser.add_argument("--seq", type=int, default=SEQ,
                        help=f"tokens per sequence of the model's step ({SEQ})")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"timed steps per variant ({ROUNDS})")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    add_target_arguments(parser)
    args = parser.parse_args()
    for name in ("tokens", "hidden", "seq", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.tokens % args.seq:
        parser.error(f"--tokens ({args.tokens}) must be a multiple of --seq ({args.seq})")
    return args


def main() -> None:
    args = parse_args()
    target = target_from_args(args)
    if args.part is not None:
        print(json.dumps(measure(args, target)))
        return
    runs = {part: {variant: in_fresh_process(part, variant) for variant in VARIANTS}
            for part in PARTS}

    def each(field: str, scale: float, digits: int) -> dict:
        return {part: {v: round(r[field] * scale, digits) for v, r in by.items()}
                for part, by in runs.items()}

    def chunked_vs_materialised(field: str) -> dict:
        return {part: round(by["chunked"][field] / by["materialised"][field], 3)
                for part, by in runs.items()}

    memory, time_ = chunked_vs_materialised("peak_bytes"), chunked_vs_materialised("step_seconds")
    print(json.dumps({
        "benchmark": "loss_memory",
        **target.describe(),
        "vocab_size": VOCAB, "hidden": args.hidden, "tokens": args.tokens, "seq": args.seq,
        "rounds": args.rounds, "chunk_tokens": chunk_tokens(VOCAB),
        "peak_memory": "device allocated" if target.on_cuda else "process RSS",
        "peak_mb": each("peak_bytes", 2**-20, 1),
        "step_seconds": each("step_seconds", 1, 4),
        "loss": each("loss", 1, 6),
        "ratios": {**{f"{part}_peak_memory_chunked_vs_materialised": r
                      for part, r in memory.items()},
                   **{f"{part}_step_time_chunked_vs_materialised": r
                      for part, r in time_.items()}},
    }, indent=2))


if __name__ == "__main__":
    main()
