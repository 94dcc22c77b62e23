"""What the loader reads: token spans and the sources of a mixture.

A `TokenSpan` is one split of one source seen as a single stream of tokens, documents back to
back, each ended by the end-of-document token. The loader asks only for ranges, so a span can
be an in-memory tensor, memory-mapped shards or ranged reads from an object store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class TokenSpan(Protocol):
    def __len__(self) -> int:
        """Tokens in the span."""

    def read(self, start: int, stop: int) -> torch.Tensor:
        """Tokens `[start, stop)` as a new 1-D int64 tensor."""

    def doc_starts(self, start: int, stop: int) -> torch.Tensor:
        """The offsets `p`, `start <= p < stop`, where a document begins (1-D int64, sorted)."""


class TensorSpan:
    """A span held in memory: small corpora and tests."""

    def __init__(self, tokens: torch.Tensor, doc_starts: torch.Tensor | None = None):
        self.tokens = tokens
        self.starts = doc_starts if doc_starts is not None else torch.zeros(1, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.tokens)

    def read(self, start: int, stop: int) -> torch.Tensor:
        return self.tokens[start:stop].long()

    def doc_starts(self, start: int, stop: int) -> torch.Tensor:
        return self.starts[(self.starts >= start) & (self.starts < stop)]


@dataclass
class MixSource:
    """One source of the job's mixture (a single dataset is a mixture of one)."""

    name: str  # the dataset's name on the platform, the folder's name in the CLI
    weight: float
    train: TokenSpan
    heldout: TokenSpan
    vocab_size: int  # the tokenizer's
    eod: int | None  # the end-of-document token; None where documents are not delimited
    # what the run's lineage names it by (engine.runtime.lineage): sha256 of the prepared
    # dataset's manifest.json bytes and its tokenizer's; empty for in-memory spans
    manifest_sha256: str = ""
    tokenizer_sha256: str = ""
