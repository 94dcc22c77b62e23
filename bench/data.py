"""The data plane against training: the loader's speed, the blend's accuracy, the mask's cost.

    .venv/bin/python -m bench.data [--preset tiny] [--steps 200] [--rounds 5]

- `loader_vs_training`: tokens/s the loader delivers to one rank (a three-source mixture of
  datasets prepared into memory-mapped token shards, about 4 MB of text each, windows drawn
  through the blend and the per-epoch permutations, document ids on) over the tokens/s the
  preset trains on at the spec's default batch (forward, backward and AdamW, one rank, every
  core), each the median of `--rounds`. It must stay far above 1 (≥ 50): data never stalls.
- `mix_error`: the largest relative gap between a source's share of the tokens seen and its
  weight over `--steps` steps of the default batch (weights 0.5, 0.3, 0.2).
- `document_mask_cost`: a training step's time with `train.data.document_mask` (documents of
  about a quarter window packed in each row) over the same step without it, medians of
  rounds taken in turn.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from engine.data.loader import TokenLoader
from engine.data.prepare import prepare
from engine.data.shards import PreparedDataset
from engine.data.sources import SourceSpec
from engine.data.span import MixSource, TensorSpan
from engine.moe import MoEModel, preset
from engine.runtime.spec import TrainSpec

WEIGHTS = (0.5, 0.3, 0.2)


def mixture(tokens: int, doc_every: int) -> list[MixSource]:
    """Three sources of `tokens` tokens each, documents every `doc_every` tokens."""
    out = []
    for i, weight in enumerate(WEIGHTS):
        g = torch.Generator().manual_seed(i)
        span = TensorSpan(torch.randint(0, 256, (tokens,), generator=g, dtype=torch.int32),
                          torch.arange(0, tokens, doc_every))
        out.append(MixSource(name=f"s{i}", weight=weight, train=span, heldout=span,
                             vocab_size=256, eod=None))
    return out


def median_seconds(work: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def prepared_mixture(folder: Path, documents: int = 2000) -> list[MixSource]:
    """Three datasets of `documents` ~2 kB documents each, prepared with the bytes tokenizer."""
    sources = []
    for i, weight in enumerate(WEIGHTS):
        raw = folder / f"raw-{i}"
        raw.mkdir()
        with open(raw / "corpus.jsonl", "w") as f:
            for d in range(documents):
                words = " ".join(f"w{(d * 31 + j * (i + 3)) % 1009}" for j in range(400))
                f.write(json.dumps({"text": words}) + "\n")
        out = folder / f"source-{i}"
        prepare([SourceSpec("jsonl", [str(raw / "corpus.jsonl")], "text")], "bytes", str(out))
        sources.append(PreparedDataset.open(str(out)).source(f"s{i}", weight))
    return sources


def loader_rate(t: TrainSpec, rounds: int, batches: int = 50) -> float:
    with tempfile.TemporaryDirectory() as folder:
        loader = TokenLoader(prepared_mixture(Path(folder)), t.seq_len, t.micro_batch, 0, 1,
                             seed=0, document_mask=True)
        seconds = median_seconds(
            lambda: [loader.next_micro_batch() for _ in range(batches)], rounds)
    return batches * t.micro_batch * t.seq_len / seconds


def step_seconds(model: MoEModel, optimizer: torch.optim.Optimizer, batch) -> Callable[[], None]:
    def step() -> None:
        out = model(batch.input_ids, batch.labels, doc_ids=batch.doc_ids)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return step


def training(t: TrainSpec, name: str, rounds: int) -> dict[str, float]:
    """Seconds per step without and with the document mask, taken in turn."""
    torch.manual_seed(0)
    model = MoEModel(preset(name))
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr)
    sources = mixture(200_000, t.seq_len // 4)
    plain = TokenLoader(sources, t.seq_len, t.micro_batch, 0, 1, seed=0).next_micro_batch()
    masked = TokenLoader(sources, t.seq_len, t.micro_batch, 0, 1, seed=0,
                         document_mask=True).next_micro_batch()
    steps = {"plain": step_seconds(model, optimizer, plain),
             "masked": step_seconds(model, optimizer, masked)}
    for step in steps.values():
        step()  # warm-up
    times: dict[str, list[float]] = {key: [] for key in steps}
    for _ in range(rounds):
        for key, step in steps.items():
            times[key].append(median_seconds(step, 1))
    return {key: statistics.median(values) for key, values in times.items()}


def mix_error(t: TrainSpec, steps: int) -> float:
    loader = TokenLoader(mixture(100_000, 1000), t.seq_len, t.micro_batch, 0, 1, seed=0)
    seen = torch.zeros(len(WEIGHTS))
    for _ in range(steps):
        seen += torch.bincount(loader.next_micro_batch().sources, minlength=len(WEIGHTS))
    shares = seen / seen.sum()
    weights = torch.tensor(WEIGHTS)
    return float(((shares - weights).abs() / weights).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    t = TrainSpec()
    loader_tokens_per_s = loader_rate(t, args.rounds)
    step = training(t, args.preset, args.rounds)
    training_tokens_per_s = t.micro_batch * t.seq_len / step["plain"]
    print(json.dumps({
        "preset": args.preset, "micro_batch": t.micro_batch, "seq_len": t.seq_len,
        "threads": torch.get_num_threads(),
        "loader_tokens_per_s": round(loader_tokens_per_s),
        "training_tokens_per_s": round(training_tokens_per_s),
        "step_s": {key: round(value, 4) for key, value in step.items()},
        "ratios": {
            "loader_vs_training": round(loader_tokens_per_s / training_tokens_per_s, 1),
            "mix_error": round(mix_error(t, args.steps), 5),
            "document_mask_cost": round(step["masked"] / step["plain"], 3),
        },
    }, indent=2))


if __name__ == "__main__":
    main()
