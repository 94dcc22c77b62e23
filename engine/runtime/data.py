"""Training data: a token stream, a held-out split, and a deterministic resumable loader.

The tokens come from engine.data: prepared token shards, memory-mapped (or read in ranges
from an object store), never a copy of the corpus per rank; the default corpus (the Python
standard library's own sources) is prepared on first use and cached.

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

import torch

from engine.data.catalog import open_sources
from engine.data.span import TokenSpan
from engine.errors import DataError
from engine.runtime.spec import JobSpec, share_errors

__all__ = ["DataError", "TokenLoader", "split_evenly", "training_data"]


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


def training_data(spec: JobSpec, rank: int, world_size: int) -> tuple[TokenLoader, TokenSpan]:
    """The job's loader for this rank, and the held-out tokens; DataError naming the field."""
    t = spec.train
    source = open_sources(spec)[0]
    if source.vocab_size > spec.model.vocab_size:
        raise DataError(f"model.vocab_size: {spec.model.vocab_size} is smaller than "
                        f"the tokenizer's vocabulary ({source.vocab_size})")
    loader = TokenLoader(source.train, t.seq_len, t.micro_batch, rank, world_size, t.seed,
                         grad_accum=t.grad_accum)
    return loader, source.heldout
