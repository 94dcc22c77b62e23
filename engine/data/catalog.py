"""The job's data sources, opened for the loader.

`train.data.mix` names prepared datasets (folders or URLs under the data roots); without it,
`train.dataset` (raw files, or the built-in standard-library corpus) is prepared on first use
into a cache keyed by its sources (paths, sizes, mtimes) and tokenizer, so it is tokenised
once per host, not once per rank and start. The cache folder is `RINGSIDE_DATA_CACHE`
(default ~/.cache/ringside/datasets); one process prepares while the others wait on a lock,
into a temporary folder renamed into place, so a reader finds a dataset whole or not at all.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path

from engine.data.prepare import MANIFEST, SHARD_BYTES, fingerprint, prepare
from engine.data.shards import PreparedDataset
from engine.data.sources import SourceSpec, source_files, stdlib_source
from engine.data.span import MixSource
from engine.data.tokenizers import load_tokenizer
from engine.runtime.spec import DatasetSpec, JobSpec

CACHE_ENV = "RINGSIDE_DATA_CACHE"
DATASET_FIELD = "train.dataset.paths"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "ringside" / "datasets")


def raw_sources(dataset: DatasetSpec) -> list[SourceSpec]:
    if dataset.kind == "stdlib":
        return [stdlib_source()]
    return [SourceSpec(dataset.kind, list(dataset.paths), dataset.field)]


def prepared(dataset: DatasetSpec, roots: Sequence[str] = ()) -> Path:
    """The cached prepared copy of `dataset` (its files confined to `roots`), made if absent.
    The built-in corpus is the engine's own, read without roots."""
    sources = raw_sources(dataset)
    roots = () if dataset.kind == "stdlib" else roots
    tokenizer = load_tokenizer(dataset.tokenizer, roots)
    files = source_files(sources, roots, DATASET_FIELD)
    folder = cache_dir() / fingerprint(files, tokenizer, dataset.holdout, SHARD_BYTES)
    if (folder / MANIFEST).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(f"{folder.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait here for the one that prepares
        if not (folder / MANIFEST).exists():
            tmp = folder.with_name(f".{folder.name}.tmp")  # a killed prepare resumes in it
            prepare(sources, dataset.tokenizer, str(tmp), holdout=dataset.holdout, roots=roots)
            os.replace(tmp, folder)
    return folder


def open_sources(spec: JobSpec) -> list[MixSource]:
    """The sources `spec` trains on, each with its weight (files confined to the spec's roots)."""
    roots = spec.data.roots
    if spec.train.data.mix:
        return [PreparedDataset.open(entry.path, roots=roots, field=f"train.data.mix.{i}.path")
                .source(entry.name, entry.weight)
                for i, entry in enumerate(spec.train.data.mix)]
    dataset = PreparedDataset.open(str(prepared(spec.train.dataset, roots)))
    return [dataset.source("dataset", 1.0)]
