"""Training data: a token stream, a held-out split, and a deterministic resumable loader.

The default corpus is real text that every machine has without a download: the Python
standard library's own source files, read in sorted order, as bytes. User corpora are text
files (globs) or JSONL files (one field per line), tokenised as bytes or with a Hugging Face
`tokenizers` tokenizer loaded from a local tokenizer.json.

The loader cuts the training stream into non-overlapping windows of `seq_len + 1` tokens and
visits them in a seeded permutation per epoch. Its whole position is one integer, the number
of windows consumed globally, so resuming (or skipping a data window on rollback) is exact,
and every data-parallel rank takes its own slice of each global micro-batch, so the global
batch does not depend on how many ranks share it.

The slices are even unless the ranks' `shares` say otherwise (a straggler rebalanced, AntDT):
rank r then takes `shares[r]` samples of each step's global batch, spread as evenly as may be
over the step's accumulation micro-steps, its slice of each global micro-batch following the
lower ranks'. A step still covers the same windows, each taken by exactly one rank.
"""

from __future__ import annotations

import io
import json
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from engine.errors import ConfigError, SpecError
from engine.runtime.confine import expand, open_confined
from engine.runtime.spec import DatasetSpec, JobSpec, share_errors

T = TypeVar("T")


class DataError(ConfigError):
    """A dataset could not be loaded; the message names the spec field at fault."""


def stdlib_source_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "idlelib", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def _expand(patterns: list[str], roots: Sequence[str]) -> list[Path]:
    files: list[Path] = []
    for i, pattern in enumerate(patterns):
        files.extend(_confined(expand, pattern, roots, f"train.dataset.paths.{i}"))
    return files


def _confined(opener: Callable[[Any, Sequence[str], str], T], path: str | Path,
              roots: Sequence[str], field: str) -> T:
    """`opener(path, roots, field)`, its refusal a DataError naming the field."""
    try:
        return opener(path, roots, field)
    except SpecError as e:
        raise DataError(str(e)) from e


def _open_text(path: Path, roots: Sequence[str]) -> io.TextIOWrapper:
    return io.TextIOWrapper(_confined(open_confined, path, roots, "train.dataset.paths"),
                            encoding="utf-8", errors="replace")


def _read_texts(spec: DatasetSpec, roots: Sequence[str] = ()) -> list[str]:
    if spec.kind == "stdlib":
        return [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_source_files()]
    texts = []
    for path in _expand(spec.paths, roots):
        with _open_text(path, roots) as f:
            if spec.kind == "text":
                texts.append(f.read())
            else:
                texts.extend(_jsonl_texts(f, path, spec.field))
    return texts


def _jsonl_texts(lines: Iterable[str], path: Path, field: str) -> list[str]:
    texts = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise DataError(f"train.dataset.paths: {path}:{lineno} is not JSON ({e})") from e
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            raise DataError(f"train.dataset.field: {path}:{lineno} has no string field {field!r}")
        texts.append(record[field])
    return texts


class ByteTokenizer:
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer from a local tokenizer.json (in `roots`, if any)."""

    def __init__(self, path: str, roots: Sequence[str] = ()):
        from tokenizers import Tokenizer

        field = "train.dataset.tokenizer"
        try:
            with _confined(open_confined, path, roots, field) as f:
                text = f.read().decode("utf-8", errors="replace")
        except OSError as e:  # a path in the roots (or unconfined): the user's to know about
            raise DataError(f"{field}: no tokenizer file at {path!r}") from e
        self._tok = Tokenizer.from_str(text)
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def load_tokenizer(spec: DatasetSpec, roots: Sequence[str] = ()) -> ByteTokenizer | HFTokenizer:
    return ByteTokenizer() if spec.tokenizer == "bytes" else HFTokenizer(spec.tokenizer, roots)


@dataclass
class TokenSplits:
    train: torch.Tensor  # 1-D int64
    heldout: torch.Tensor
    vocab_size: int


def load_tokens(spec: DatasetSpec, roots: Sequence[str] = ()) -> TokenSplits:
    """Tokenise the whole corpus (its files confined to `roots`, if any); the last `holdout`
    fraction of each document is held out, so both splits see every kind of text."""
    tokenizer = load_tokenizer(spec, roots)
    texts = [t for t in _read_texts(spec, roots) if t]
    if not texts:
        raise DataError("train.dataset.paths: the dataset holds no text")
    if isinstance(tokenizer, ByteTokenizer):
        docs = [torch.frombuffer(bytearray(t.encode("utf-8")), dtype=torch.uint8) for t in texts]
    else:
        docs = [torch.tensor(tokenizer.encode(t), dtype=torch.int32) for t in texts]
    train_parts, held_parts = [], []
    for doc in docs:
        cut = len(doc) - int(len(doc) * spec.holdout)
        train_parts.append(doc[:cut])
        held_parts.append(doc[cut:])
    return TokenSplits(
        train=torch.cat(train_parts).long(),
        heldout=torch.cat(held_parts).long(),
        vocab_size=tokenizer.vocab_size,
    )


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` cut into `parts` whole numbers that differ by at most one, larger ones first."""
    whole, extra = divmod(total, parts)
    return [whole + (i < extra) for i in range(parts)]


class TokenLoader:
    """Deterministic batches of (input_ids, labels) for one data-parallel rank.

    `position` counts windows consumed by all ranks together; with the ranks' `shares` of the
    step's batch it is the whole `state_dict()`.
    """

    def __init__(
        self, tokens: torch.Tensor, seq_len: int, micro_batch: int, rank: int, world_size: int,
        seed: int, shuffle: bool = True, grad_accum: int = 1,
    ):
        self.windows = (len(tokens) - 1) // seq_len
        if self.windows < micro_batch * world_size:
            raise DataError(
                f"train.seq_len: the dataset has {len(tokens)} tokens, too few for "
                f"{micro_batch * world_size} windows of {seq_len}"
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.grad_accum = grad_accum
        self.global_batch = micro_batch * world_size * grad_accum  # samples per step
        self.shares = self.even_shares()
        self.position = 0
        self._epoch = -1
        self._order = torch.arange(self.windows)

    def even_shares(self) -> list[int]:
        return [self.micro_batch * self.grad_accum] * self.world_size

    def share_errors(self, shares: object) -> str | None:
        """Why `shares` cannot split this loader's step, or None."""
        return share_errors(shares, self.world_size, self.global_batch, self.grad_accum)

    def set_shares(self, shares: list[int]) -> None:
        """From the next step on, rank r takes `shares[r]` samples of each step."""
        error = self.share_errors(shares)
        if error is not None:
            raise ValueError(f"shares: {error}")
        self.shares = list(shares)

    @property
    def rebalanced(self) -> bool:
        return self.shares != self.even_shares()

    def micro_sizes(self, micro: int) -> list[int]:
        """Each rank's samples in micro-step `micro` of a step."""
        return [split_evenly(n, self.grad_accum)[micro] for n in self.shares]

    def first_sample(self, micro: int = 0) -> int:
        """The global index of this rank's first sample in the next global micro-batch."""
        return self.position + sum(self.micro_sizes(micro)[: self.rank])

    def step_samples(self, position: int, rank: int) -> list[int]:
        """The global sample indices rank `rank` trains on in the step that starts at loader
        position `position` (with the present shares), micro-step by micro-step."""
        samples = []
        for micro in range(self.grad_accum):
            sizes = self.micro_sizes(micro)
            first = position + sum(sizes[:rank])
            samples.extend(range(first, first + sizes[rank]))
            position += sum(sizes)
        return samples

    def window(self, global_index: int) -> int:
        """The dataset window (tokens window*seq_len .. +seq_len) of a global sample index."""
        epoch, offset = divmod(global_index, self.windows)
        if self.shuffle and epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = torch.randperm(self.windows, generator=g)
            self._epoch = epoch
        return int(self._order[offset])

    def next_batch(self, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's slice of the next global micro-batch, micro-step `micro` of its step."""
        sizes = self.micro_sizes(micro)
        first = self.first_sample(micro)
        rows = []
        for i in range(first, first + sizes[self.rank]):
            start = self.window(i) * self.seq_len
            rows.append(self.tokens[start : start + self.seq_len + 1])
        self.position += sum(sizes)
        batch = torch.stack(rows)
        return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()

    def state_dict(self) -> dict[str, object]:
        return {"position": self.position, "seed": self.seed, "shares": list(self.shares)}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's position and shares; shares that do not fit this run (another world
        size or batch: a reshard) give way to even ones."""
        self.position = int(state["position"])
        self.seed = int(state["seed"])
        shares = state.get("shares")  # none before rebalancing existed
        self.shares = shares if self.share_errors(shares) is None else self.even_shares()
        self._epoch = -1


def training_data(spec: JobSpec, rank: int, world_size: int) -> tuple[TokenLoader, torch.Tensor]:
    """The job's loader for this rank, and the held-out tokens; DataError naming the field."""
    t = spec.train
    splits = load_tokens(t.dataset, spec.data.roots)
    if splits.vocab_size > spec.model.vocab_size:
        raise DataError(f"model.vocab_size: {spec.model.vocab_size} is smaller than "
                        f"the tokenizer's vocabulary ({splits.vocab_size})")
    loader = TokenLoader(splits.train, t.seq_len, t.micro_batch, rank, world_size, t.seed,
                         grad_accum=t.grad_accum)
    return loader, splits.heldout
