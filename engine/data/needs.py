"""What a job's spec needs of each of its data sources, judged once for the platform (before the
job queues, from a prepared dataset's manifest) and the engine (at start, from the opened
spans): a vocabulary the model holds, one step's batch of training windows, and, when it
evaluates, one evaluation batch of held-out windows (the held-out loader takes a global
micro-batch at a time, engine.data.loader). A window is `seq_len + 1` tokens, windows
overlapping by one (engine.data.loader). Re-exported by engine.runtime.spec, the platform's
way in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the spec imports this module to re-export it
    from engine.runtime.spec import JobSpec


@dataclass(frozen=True)
class SourceSize:
    """One source as the rule sees it; `field` is the spec field that chose it, `holdout_field`
    the one that sets its held-out split (the same unless the spec does), and `holdout_hint`
    how the caller's user gets a larger split."""

    name: str  # "" for the single dataset of `train.dataset`
    field: str
    vocab_size: int
    train_tokens: int
    heldout_tokens: int
    holdout_field: str = ""
    holdout_hint: str = ""


def windows(tokens: int, seq_len: int) -> int:
    """Whole windows of `seq_len + 1` tokens (each overlapping the next by one) in `tokens`."""
    return max(0, tokens - 1) // seq_len


def data_errors(spec: JobSpec, sources: Sequence[SourceSize],
                world_size: int) -> dict[str, str]:
    """What `sources` cannot give `spec` run on `world_size` ranks, by field (empty: enough)."""
    t, errors = spec.train, {}
    step = t.micro_batch * world_size * t.grad_accum
    evaluation = t.micro_batch * world_size
    for source in sources:
        where = f"dataset {source.name!r}" if source.name else "the dataset"
        if source.vocab_size > spec.model.vocab_size:
            errors["model.vocab_size"] = (f"must be at least {source.vocab_size}, the "
                                          f"vocabulary of {where}'s tokenizer")
        if windows(source.train_tokens, t.seq_len) < step:
            errors[source.field] = (
                f"{where} holds {source.train_tokens} training tokens, fewer than one step's "
                f"batch ({step} windows of train.seq_len {t.seq_len} + 1)")
        elif t.eval_every and windows(source.heldout_tokens, t.seq_len) < evaluation:
            errors[source.holdout_field or source.field] = (
                f"{where}'s held-out split holds {source.heldout_tokens} tokens, fewer than one "
                f"evaluation batch ({evaluation} windows of train.seq_len {t.seq_len} + 1)"
                + (f": {source.holdout_hint}" if source.holdout_hint else ""))
    return errors
