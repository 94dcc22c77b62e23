"""Training data at corpus scale (specs/data.md).

- `span`: what the loader reads — a token span (one split of one source) and a mix source.
- `sources`: the raw text (text, JSONL, Parquet; local or object store; the built-in corpus).
- `tokenizers`: bytes or a Hugging Face tokenizer, its hash, vocabulary and end-of-document id.
- `prepare`: sources tokenised over the host's cores into token shards, manifest last.
- `shards`: `PreparedDataset`, a prepared folder or URL read as spans (memory-mapped, ranged).
- `cache`: `train.dataset` (raw files) prepared on first use, once per host.
- `catalog`: `open_sources(spec)`, the job's sources as spans, opened from prepared folders.

A dataset is tokenised once (`python -m engine.data prepare`) into memory-mapped token shards
with a manifest written last; every rank streams the shards, never a copy of the corpus.
"""
