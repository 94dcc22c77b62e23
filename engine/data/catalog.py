"""The job's data sources, opened for the loader: the prepared datasets `train.data.mix` names
(folders or URLs under the data roots), or else `train.dataset`, prepared on first use into
the cache (engine.data.cache)."""

from __future__ import annotations

from engine.data.cache import prepared
from engine.data.shards import PreparedDataset
from engine.data.span import MixSource
from engine.runtime.spec import JobSpec


def open_sources(spec: JobSpec) -> list[MixSource]:
    """The sources `spec` trains on, each with its weight (files confined to the spec's roots)."""
    roots = spec.data.roots
    if spec.train.data.mix:
        return [PreparedDataset.open(entry.path, roots=roots, field=f"train.data.mix.{i}.path")
                .source(entry.name, entry.weight)
                for i, entry in enumerate(spec.train.data.mix)]
    dataset = PreparedDataset.open(str(prepared(spec.train.dataset, roots)))
    return [dataset.source("dataset", 1.0)]
