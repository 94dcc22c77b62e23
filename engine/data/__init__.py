"""Training data at corpus scale (specs/data.md).

- `span`: what the loader reads — a token span (one split of one source) and a mix source.
- `catalog`: `open_sources(spec)`, the job's sources as spans, opened from prepared folders.

A dataset is tokenised once (`python -m engine.data prepare`) into memory-mapped token shards
with a manifest written last; every rank streams the shards, never a copy of the corpus.
"""
