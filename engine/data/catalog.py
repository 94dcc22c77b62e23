"""The job's data sources, opened for the loader."""

from __future__ import annotations

from engine.data.span import MixSource, TensorSpan
from engine.runtime.data import load_tokens
from engine.runtime.spec import JobSpec


def open_sources(spec: JobSpec) -> list[MixSource]:
    """The sources `spec` trains on, each with its weight (files confined to the spec's roots)."""
    splits = load_tokens(spec.train.dataset, spec.data.roots)
    return [MixSource(name="dataset", weight=1.0, train=TensorSpan(splits.train),
                      heldout=TensorSpan(splits.heldout), vocab_size=splits.vocab_size, eod=None)]
