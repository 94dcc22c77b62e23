"""The data plane: preparing a corpus, and a run's start-up and memory on a large one.

Parts (each adds figures and ratios to one JSON document; `--parts` picks them):
- `prepare`: `engine.data.prepare` on `--prepare-mb` of standard-library text (JSONL) with a
  BPE tokenizer trained here on the same text (nothing can be downloaded), against that
  tokenizer's own `encode_batch` over the same documents, already in memory, on the same cores
  (its Rayon threads). `prepare_vs_tokenizer`: prepare's tokens/s over encode_batch's, so the
  overhead of reading, splitting, checksumming and writing shows as the gap below 1.
- `startup`: a `tiny` CPU job of two ranks on a prepared corpus of `--large-mb` MB of token
  shards against one of `--small-mb` MB (both from repeated, perturbed standard-library text,
  byte-tokenised): the time from launch to the first step and the worst rank's peak RSS, each
  the best of `--repeats` launches, taken in turn. `startup_large_vs_small` and
  `rss_large_vs_small` are flat (1.0) when nothing of the corpus is loaded per rank. The
  data plane alone (open a dataset, read 64 random windows, in a process of its own) is in
  the figures beside them, and the time to check every checksum of the large one
  (`verify_large_s`: what a start would pay to verify on open).
- `loader`: the loader's tokens/s for one rank (a three-source mixture of datasets prepared
  here, about 4 MB of text each, windows drawn through the blend and the per-epoch
  permutations, document ids on) over the tokens/s the `--preset` model trains on at the
  spec's default batch (forward, backward and AdamW in this process), medians of `--rounds`:
  `loader_vs_training` (≥ 50: data never stalls a step). `mix_error`: the largest relative
  gap between a source's share of the tokens seen and its weight (0.5, 0.3, 0.2) over
  `--steps` steps. `document_mask_cost`: a training step with `train.data.document_mask`
  (documents of a quarter window) over the same step without it, taken in turn.

    python -m bench.data [--parts prepare,startup,loader] [--prepare-mb 32] [--large-mb 2048]
                         [--small-mb 10] [--repeats 2] [--dir DIR] [--preset tiny]
                         [--steps 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from engine.data.loader import TokenLoader
from engine.data.prepare import prepare
from engine.data.shards import PreparedDataset
from engine.data.sources import SourceSpec, stdlib_source_files
from engine.data.span import MixSource, TensorSpan
from engine.moe import MoEModel, preset
from engine.runtime.spec import TrainSpec

Part = Callable[[argparse.Namespace, Path], tuple[dict, dict]]


def stdlib_texts() -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_source_files()]


def write_corpus(folder: Path, megabytes: float, file_mb: int = 64) -> list[Path]:
    """JSONL files of about `megabytes` in all: the standard library's sources over and over,
    each copy's documents marked with its number so no two documents are the same."""
    folder.mkdir(parents=True, exist_ok=True)
    texts, target = stdlib_texts(), int(megabytes * 1e6)
    files, written, f = [], 0, None
    for copy in range(10**6):
        for i, text in enumerate(texts):
            if f is None or f.tell() >= file_mb * 1e6:
                if f is not None:
                    f.close()
                files.append(folder / f"part-{len(files):04d}.jsonl")
                f = files[-1].open("w")
            line = json.dumps({"text": f"# copy {copy} of file {i}\n{text}"}) + "\n"
            f.write(line)
            written += len(line)
            if written >= target:
                f.close()
                return files
    raise AssertionError("unreachable")


def train_bpe(folder: Path, vocab_size: int = 8192) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(stdlib_texts()[:300], trainer)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def documents(files: list[Path]) -> Iterator[str]:
    for path in files:
        with path.open() as f:
            for line in f:
                yield json.loads(line)["text"]


def prepare_part(args: argparse.Namespace, root: Path) -> tuple[dict, dict]:
    from tokenizers import Tokenizer

    files = write_corpus(root / "prepare-src", args.prepare_mb, file_mb=8)
    tokenizer = train_bpe(root)
    texts = list(documents(files))
    tok = Tokenizer.from_file(str(tokenizer))
    ours, theirs = [], []
    for repeat in range(args.repeats):
        started = time.perf_counter()
        tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
        theirs.append(tokens / (time.perf_counter() - started))
        out = root / f"prepared-{repeat}"
        started = time.perf_counter()
        manifest = prepare([SourceSpec("jsonl", [str(f) for f in files])], str(tokenizer),
                           str(out), holdout=0.01)
        elapsed = time.perf_counter() - started
        ours.append(sum(s["tokens"] for s in manifest["splits"].values()) / elapsed)
        shutil.rmtree(out)
    figures = {"prepare_mb": args.prepare_mb, "cores": len(os.sched_getaffinity(0)),
               "tokens": tokens, "prepare_tokens_per_s": max(ours),
               "encode_batch_tokens_per_s": max(theirs), "prepare_runs": ours,
               "encode_batch_runs": theirs}
    return figures, {"prepare_vs_tokenizer": max(ours) / max(theirs)}


def prepared_corpus(root: Path, name: str, megabytes: float) -> tuple[Path, float]:
    """A byte-tokenised corpus of about `megabytes` of shards (uint16: half as much text)."""
    out = root / name
    files = write_corpus(root / f"{name}-src", megabytes / 2)
    started = time.perf_counter()
    prepare([SourceSpec("jsonl", [str(f) for f in files])], "bytes", str(out), holdout=0.01)
    elapsed = time.perf_counter() - started
    shutil.rmtree(root / f"{name}-src")
    return out, elapsed


def first_step(root: Path, dataset: Path, tag: str) -> tuple[float, int]:
    """A two-rank `tiny` job on `dataset`: seconds from launch to its first step, and the
    largest RSS any rank reported."""
    from engine.runtime.events import read_events
    from engine.runtime.launch import RunTarget, launch
    from engine.runtime.spec import parse_spec

    spec = parse_spec({
        "name": f"data-{tag}", "model": {"preset": "tiny"},
        "parallel": {"nodes": 1, "procs_per_node": 2},
        "train": {"steps": 3, "micro_batch": 2, "seq_len": 128, "eval_every": 0,
                  "device": "cpu", "data": {"mix": [{"path": str(dataset)}]}},
        "checkpoint": {"every": 0},
    })
    run = root / "runs" / tag
    target = RunTarget(run_dir=run, events_path=run / "events.jsonl", job=spec.name)
    started = time.time()
    if launch(spec, target) != 0:
        raise RuntimeError(f"the {tag} run did not complete")
    steps = [e for e in read_events(target.events_path) if e["type"] == "step"]
    return steps[0]["time"] - started, max(e["memory"]["rss_bytes"] for e in steps)


OPEN = """
import resource, sys, time
import torch
from engine.data.shards import PreparedDataset
started = time.perf_counter()
span = PreparedDataset.open(sys.argv[1]).split("train")
g = torch.Generator().manual_seed(0)
for start in torch.randint(0, len(span) - 129, (64,), generator=g).tolist():
    span.read(start, start + 129)
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def open_cost(folder: Path) -> tuple[float, int]:
    """The data plane alone, in a process of its own: seconds to open the dataset and read 64
    random windows, and the process's peak RSS."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", OPEN, str(folder)], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), int(out[1])


def startup_part(args: argparse.Namespace, root: Path) -> tuple[dict, dict]:
    large, large_s = prepared_corpus(root, "large", args.large_mb)
    small, _ = prepared_corpus(root, "small", args.small_mb)
    runs: dict[str, list[tuple[float, int]]] = {"large": [], "small": []}
    for repeat in range(args.repeats):
        for name, folder in (("small", small), ("large", large)):
            runs[name].append(first_step(root, folder, f"{name}-{repeat}"))
    best = {name: (min(r[0] for r in rs), min(r[1] for r in rs)) for name, rs in runs.items()}
    opened = {name: open_cost(folder) for name, folder in (("small", small), ("large", large))}
    started = time.perf_counter()
    PreparedDataset.open(str(large), verify=True)  # every checksum: what a start would pay
    verify_s = time.perf_counter() - started
    shard_bytes = {name: sum(f.stat().st_size for f in folder.rglob("shard-*"))
                   for name, folder in (("large", large), ("small", small))}
    figures = {"shard_bytes": shard_bytes, "prepare_large_s": large_s,
               "first_step_s": {n: b[0] for n, b in best.items()},
               "peak_rss_bytes": {n: b[1] for n, b in best.items()}, "runs": runs,
               "open_and_read_64_windows_s": {n: o[0] for n, o in opened.items()},
               "open_peak_rss_bytes": {n: o[1] for n, o in opened.items()},
               "verify_large_s": verify_s}
    return figures, {"startup_large_vs_small": best["large"][0] / best["small"][0],
                     "rss_large_vs_small": best["large"][1] / best["small"][1]}


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
        raw.mkdir(parents=True)
        with open(raw / "corpus.jsonl", "w") as f:
            for d in range(documents):
                words = " ".join(f"w{(d * 31 + j * (i + 3)) % 1009}" for j in range(400))
                f.write(json.dumps({"text": words}) + "\n")
        out = folder / f"source-{i}"
        prepare([SourceSpec("jsonl", [str(raw / "corpus.jsonl")], "text")], "bytes", str(out))
        sources.append(PreparedDataset.open(str(out)).source(f"s{i}", weight))
    return sources


def loader_rate(t: TrainSpec, root: Path, rounds: int, batches: int = 50) -> float:
    loader = TokenLoader(prepared_mixture(root), t.seq_len, t.micro_batch, 0, 1, seed=0,
                         document_mask=True)
    seconds = median_seconds(lambda: [loader.next_micro_batch() for _ in range(batches)],
                             rounds)
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


def loader_part(args: argparse.Namespace, root: Path) -> tuple[dict, dict]:
    t = TrainSpec()
    loader_tokens_per_s = loader_rate(t, root, args.rounds)
    step = training(t, args.preset, args.rounds)
    training_tokens_per_s = t.micro_batch * t.seq_len / step["plain"]
    figures = {"preset": args.preset, "micro_batch": t.micro_batch, "seq_len": t.seq_len,
               "threads": torch.get_num_threads(), "loader_tokens_per_s": loader_tokens_per_s,
               "training_tokens_per_s": training_tokens_per_s, "step_s": step}
    return figures, {"loader_vs_training": loader_tokens_per_s / training_tokens_per_s,
                     "mix_error": mix_error(t, args.steps),
                     "document_mask_cost": step["masked"] / step["plain"]}


PARTS: dict[str, Part] = {"prepare": prepare_part, "startup": startup_part,
                          "loader": loader_part}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated")
    parser.add_argument("--prepare-mb", type=float, default=32)
    parser.add_argument("--large-mb", type=float, default=2048)
    parser.add_argument("--small-mb", type=float, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-data-", dir=args.dir))
    document: dict = {"figures": {}, "ratios": {}}
    try:
        for name in args.parts.split(","):
            figures, ratios = PARTS[name](args, root / name)
            document["figures"][name] = figures
            document["ratios"].update(ratios)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    json.dump(document, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
