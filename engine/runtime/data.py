"""Training data read from text: a token stream and a held-out split (engine.data.loader
trains on it).

The default corpus is real text that every machine has without a download: the Python
standard library's own source files, read in sorted order, as bytes. User corpora are text
files (globs) or JSONL files (one field per line), tokenised as bytes or with a Hugging Face
`tokenizers` tokenizer loaded from a local tokenizer.json.
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
from engine.runtime.spec import DatasetSpec

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
