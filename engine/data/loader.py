"""The deterministic, resumable loader over the job's sources.

Each source's training span is cut into non-overlapping windows of `seq_len + 1` tokens
(window `w` is tokens `[w·L, (w+1)·L + 1)`), visited in a seeded permutation per epoch. The
blend (engine.data.blend) maps every global sample index to a source and the sample of that
source it is. The loader's whole position is one integer, the number of samples consumed
globally, with the blend's few change points beside it: resuming (or skipping a data window
on rollback) is exact, and every data-parallel rank takes its own slice of each global
micro-batch, so the global batch — and the token sequence — do not depend on how many ranks
share it.

The slices are even unless the ranks' `shares` say otherwise (a straggler rebalanced, AntDT):
rank r then takes `shares[r]` samples of each step's global batch, spread as evenly as may be
over the step's accumulation micro-steps, its slice of each global micro-batch following the
lower ranks'. A step still covers the same windows, each taken by exactly one rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import torch

from engine.data.blend import Blend
from engine.data.catalog import open_sources
from engine.data.needs import SourceSize, data_errors
from engine.data.permutation import Permutation
from engine.data.span import MixSource, TensorSpan
from engine.errors import DataError
from engine.runtime.spec import JobSpec, share_errors


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` cut into `parts` whole numbers that differ by at most one, larger ones first."""
    whole, extra = divmod(total, parts)
    return [whole + (i < extra) for i in range(parts)]


class Batch(NamedTuple):
    input_ids: torch.Tensor  # [B, L]
    labels: torch.Tensor  # [B, L]
    sources: torch.Tensor  # [B]: each row's source, an index into the loader's sources
    doc_ids: torch.Tensor | None  # [B, L]: each token's document within its row; None: no mask


def as_sources(tokens: torch.Tensor) -> list[MixSource]:
    """One in-memory token stream as a mixture of one (its held-out split the same stream)."""
    span = TensorSpan(tokens)
    return [MixSource(name="dataset", weight=1.0, train=span, heldout=span, vocab_size=0,
                      eod=None)]


class TokenLoader:
    """Deterministic batches for one data-parallel rank, over `sources` (or one tensor).

    `position` counts samples consumed by all ranks together; with the ranks' `shares` of the
    step's batch and the blend's change points it is the whole `state_dict()`.
    """

    def __init__(
        self, sources: torch.Tensor | Sequence[MixSource], seq_len: int, micro_batch: int,
        rank: int, world_size: int, seed: int, shuffle: bool = True, grad_accum: int = 1,
        document_mask: bool = False,
    ):
        self.sources = as_sources(sources) if isinstance(sources, torch.Tensor) else list(sources)
        self.windows = [(len(s.train) - 1) // seq_len for s in self.sources]
        if sum(self.windows) < micro_batch * world_size or min(self.windows) < 1:
            raise DataError(
                f"train.seq_len: the dataset has {[len(s.train) for s in self.sources]} tokens, "
                f"too few for {micro_batch * world_size} windows of {seq_len}"
            )
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.grad_accum = grad_accum
        self.document_mask = document_mask
        self.global_batch = micro_batch * world_size * grad_accum  # samples per step
        self.shares = self.even_shares()
        self.blend = Blend([s.weight for s in self.sources])
        self.position = 0
        self._orders: dict[int, tuple[int, Permutation]] = {}  # source -> (epoch, order)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

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

    def set_weights(self, weights: Sequence[float]) -> None:
        """From the next sample on (the loader's position), blend the sources at `weights`."""
        self.blend.set_weights(weights, self.position)

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

    def source_counts(self, position: int) -> list[int]:
        """Every source's samples among the global indices before `position`."""
        return self.blend.counts_at(position)

    def _window(self, source: int, sample: int) -> int:
        """The window of the source's `sample`-th sample: its epoch's permutation, seeded."""
        epoch, offset = divmod(sample, self.windows[source])
        if not self.shuffle:
            return offset
        cached = self._orders.get(source)
        if cached is None or cached[0] != epoch:
            seed = self.seed * 1_000_003 + epoch + source * 7_919
            cached = self._orders[source] = (epoch, Permutation(self.windows[source], seed))
        return cached[1](offset)

    def window(self, global_index: int) -> int:
        """The window (tokens window*seq_len .. +seq_len of its source) of a global index."""
        sources, samples = self.blend.assign(global_index, global_index + 1)
        return self._window(int(sources[0]), int(samples[0]))

    def _row(self, source: int, sample: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The window's seq_len + 1 tokens, and with the mask on each input token's document."""
        span, length = self.sources[source].train, self.seq_len
        start = self._window(source, sample) * length
        tokens = span.read(start, start + length + 1)
        if not self.document_mask:
            return tokens, None
        starts = span.doc_starts(start + 1, start + length) - start
        marks = torch.zeros(length, dtype=torch.long)
        marks[starts] = 1
        return tokens, marks.cumsum(0)

    def next_micro_batch(self, micro: int = 0) -> Batch:
        """This rank's slice of the next global micro-batch, micro-step `micro` of its step."""
        sizes = self.micro_sizes(micro)
        first = self.first_sample(micro)
        sources, samples = self.blend.assign(first, first + sizes[self.rank])
        rows = [self._row(int(s), int(k)) for s, k in zip(sources, samples, strict=True)]
        self.position += sum(sizes)
        self._prefetch((micro + 1) % self.grad_accum)
        batch = torch.stack([tokens for tokens, _ in rows])
        doc_ids = torch.stack([ids for _, ids in rows]) if self.document_mask else None
        return Batch(batch[:, :-1].contiguous(), batch[:, 1:].contiguous(), sources, doc_ids)

    def _prefetch(self, micro: int) -> None:
        """Ask the spans that read from an object store for this rank's next micro-batch
        now, so its windows arrive while this one trains (a local span has no `prefetch`:
        memory-mapped shards are the page cache's)."""
        first = self.first_sample(micro)
        sources, samples = self.blend.assign(first, first + self.micro_sizes(micro)[self.rank])
        for s, k in zip(sources.tolist(), samples.tolist(), strict=True):
            prefetch = getattr(self.sources[s].train, "prefetch", None)
            if prefetch is not None:
                start = self._window(s, k) * self.seq_len
                prefetch(start, start + self.seq_len + 1)

    def next_batch(self, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, labels) of `next_micro_batch`."""
        batch = self.next_micro_batch(micro)
        return batch.input_ids, batch.labels

    def state_dict(self) -> dict[str, object]:
        return {"position": self.position, "seed": self.seed, "shares": list(self.shares),
                "blend": self.blend.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's position, shares and blend; shares that do not fit this run (another
        world size or batch: a reshard) give way to even ones."""
        self.position = int(state["position"])
        self.seed = int(state["seed"])
        shares = state.get("shares")  # none before rebalancing existed
        self.shares = shares if self.share_errors(shares) is None else self.even_shares()
        if "blend" in state:  # none before mixtures existed: one source, nothing to restore
            self.blend.load_state_dict(state["blend"])
        self._orders.clear()


def heldout_loaders(loader: TokenLoader) -> list[TokenLoader]:
    """One loader per source over its held-out split, in order (evaluation: the same windows
    every time)."""
    return [TokenLoader([dataclasses.replace(source, weight=1.0, train=source.heldout)],
                        loader.seq_len, loader.micro_batch, loader.rank, loader.world_size,
                        loader.seed, shuffle=False, document_mask=loader.document_mask)
            for source in loader.sources]


def training_data(spec: JobSpec, rank: int, world_size: int) -> TokenLoader:
    """The job's loader for this rank; DataError naming the field at fault."""
    t = spec.train
    sources = open_sources(spec)
    errors = data_errors(spec, [_size(spec, i, s) for i, s in enumerate(sources)], world_size)
    if errors:
        raise DataError("; ".join(f"{field}: {message}" for field, message in errors.items()))
    return TokenLoader(sources, t.seq_len, t.micro_batch, rank, world_size, t.seed,
                       grad_accum=t.grad_accum, document_mask=t.data.document_mask)


def _size(spec: JobSpec, i: int, source: MixSource) -> SourceSize:
    """Source `i` of `spec` as the data rule sees it, named by the field that chose it."""
    if spec.train.data.mix:
        return SourceSize(source.name, f"train.data.mix.{i}.path", source.vocab_size,
                          len(source.train), len(source.heldout))
    return SourceSize("", "train.dataset.paths", source.vocab_size, len(source.train),
                      len(source.heldout), holdout_field="train.dataset.holdout")
