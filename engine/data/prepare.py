"""Prepare a dataset once: tokenise its sources over the host's cores into token shards.

The output folder (or object-store prefix) holds, per split (`train`, `heldout`):
    <split>/shard-NNNNN.bin   tokens, raw little-endian uint16 (a vocabulary that fits) or
                              uint32, documents back to back, each ended by the tokenizer's
                              end-of-document token
    <split>/shard-NNNNN.idx   int64: where each of the shard's documents starts
and `manifest.json`, written last, so a dataset is whole or absent. Shard k of both splits
comes from the same run of source pieces (about `shard_bytes` of source); while the prepare
runs, `prepare-state.json` records each finished shard, and a prepare killed mid-way resumes
from the last one. Whole documents are held out — every k-th, starting with the second, k =
1/holdout — so the held-out split is never empty when there are two documents or more; a
single document is split instead, its tail held out.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import xxhash

from engine.checkpoint import store
from engine.checkpoint.store import Location, location
from engine.data.sources import (
    Piece,
    SourceFile,
    SourceSpec,
    file_checksum,
    pieces,
    read_piece,
    source_files,
)
from engine.data.tokenizers import Tokenizer, load_tokenizer, token_dtype
from engine.errors import DataError

FORMAT = "ringside-tokens"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATE = "prepare-state.json"
SPLITS = ("train", "heldout")
SHARD_BYTES = 256 << 20  # source bytes per shard
_BATCH = 256  # documents per encode_batch call
REPORT_S = 0.5
INLINE_BYTES = 4 << 20  # less source than this is tokenised without worker processes


@dataclass
class PrepareProgress:
    documents: int = 0
    tokens: int = 0
    bytes_read: int = 0
    bytes_total: int = 0
    shards_done: int = 0
    shards_total: int = 0
    elapsed_s: float = 0.0
    bytes_resumed: int = 0  # of bytes_read, those a resumed prepare found already done

    @property
    def mb_per_s(self) -> float:
        done = self.bytes_read - self.bytes_resumed
        return done / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        rate = self.mb_per_s * 1e6
        return (self.bytes_total - self.bytes_read) / rate if rate > 0 else None


@dataclass
class PieceTokens:
    tokens: np.ndarray  # the piece's documents back to back, each ended by the eod token
    lengths: np.ndarray  # int64: each document's tokens, its eod included
    digest: bytes  # of the piece's source bytes
    size: int  # source bytes


def encode_documents(tokenizer: Tokenizer,
                     documents: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """`documents` tokenised, each ended by the eod token: (tokens, each one's length)."""
    dtype = token_dtype(tokenizer.vocab_size)
    eod = np.array([tokenizer.eod], dtype=dtype)
    parts: list[np.ndarray] = []
    for i in range(0, len(documents), _BATCH):
        for ids in tokenizer.encode_batch(documents[i : i + _BATCH]):
            parts += [ids.astype(dtype, copy=False), eod]
    lengths = np.array([len(p) + 1 for p in parts[::2]], dtype=np.int64)
    return (np.concatenate(parts) if parts else np.empty(0, dtype)), lengths


_worker: tuple[Tokenizer, Sequence[str]] | None = None


def _init_worker(tokenizer: Tokenizer, roots: Sequence[str], process: bool = True) -> None:
    global _worker
    if process:  # one core per worker process; in the caller's, the tokenizer's own threads
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker = (tokenizer, tuple(roots))


def _tokenize(piece: Piece) -> PieceTokens:
    assert _worker is not None
    tokenizer, roots = _worker
    documents, digest = read_piece(piece, roots)
    tokens, lengths = encode_documents(tokenizer, documents)
    return PieceTokens(tokens, lengths, digest, piece.stop - piece.start)


class _Workers:
    """Pieces tokenised in order, by worker processes (or in this one, for one worker). The
    workers come from a fork server, a process started clean (one thread, this module
    imported) that forks each in milliseconds; they get the tokenizer pickled. Forked from the
    caller itself, a worker could inherit a lock that another of the caller's threads held at
    the fork (a checkpoint writer's, a client's) and wait on it for good."""

    def __init__(self, workers: int, tokenizer: Tokenizer, roots: Sequence[str],
                 todo: Sequence[Piece]):
        size = sum(p.stop - p.start for p in todo)
        self.count = min(workers or len(os.sched_getaffinity(0)), len(todo))
        if not workers and size < INLINE_BYTES:
            self.count = 1  # starting processes would cost more than they save
        self.pool = None
        if self.count > 1:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([__name__])  # if the server is not running yet
            self.pool = context.Pool(self.count, _init_worker, (tokenizer, tuple(roots)))
        else:
            _init_worker(tokenizer, roots, process=False)

    def map(self, todo: Sequence[Piece]) -> Iterator[PieceTokens]:
        if self.pool is None:
            return map(_tokenize, todo)
        return self.pool.imap(_tokenize, todo)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def shard_name(k: int) -> str:
    return f"shard-{k:05d}"


def shard_groups(todo: Sequence[Piece], shard_bytes: int) -> list[int]:
    """How many pieces each shard takes: consecutive pieces up to about `shard_bytes`."""
    counts: list[int] = []
    size = shard_bytes
    for piece in todo:
        if size >= shard_bytes:
            counts.append(0)
            size = 0
        counts[-1] += 1
        size += piece.stop - piece.start
    return counts


def held_out(first: int, count: int, every: int) -> np.ndarray:
    """Which of documents first..first+count are held out: every `every`-th, from the second."""
    if not every:
        return np.zeros(count, dtype=bool)
    return (np.arange(first, first + count) % every) == 1


@dataclass
class _Run:
    dest: Location
    dtype: np.dtype
    every: int
    progress: PrepareProgress
    report: Callable[[PrepareProgress], None]
    started: float = field(default_factory=time.monotonic)
    tag: str = field(default_factory=lambda: f"{os.getpid()}")
    reported: float = 0.0

    def tick(self, force: bool = False) -> None:
        """Report progress: at the start, at each shard's end, and between them at most
        every `REPORT_S` (a caller may store each report)."""
        now = time.monotonic()
        self.progress.elapsed_s = now - self.started
        if force or now - self.reported >= REPORT_S:
            self.reported = now
            self.report(replace(self.progress))  # a snapshot: the caller may keep it


def _write(where: Location, chunks: Iterator[bytes] | list[bytes], tag: str) -> str:
    """Write a file whole or not at all; its xxh3-128 checksum."""
    hasher = xxhash.xxh3_128()

    def hashed() -> Iterator[bytes]:
        for chunk in chunks:
            hasher.update(chunk)
            yield chunk

    store.write(where, hashed(), tag)
    return hasher.hexdigest()


def _shard_entry(run: _Run, split: str, k: int, tokens: list[bytes] | Iterator[bytes],
                 lengths: Callable[[], list[np.ndarray]]) -> dict:
    """Write one split's shard k; `lengths()` (its documents' lengths) is read after `tokens`
    is consumed, since a streamed shard learns them as it goes."""
    folder = run.dest / split
    checksum = _write(folder / f"{shard_name(k)}.bin", tokens, run.tag)
    sizes = np.concatenate(lengths()) if lengths() else np.empty(0, np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype("<i8") if len(sizes) else sizes
    index_checksum = _write(folder / f"{shard_name(k)}.idx", [starts.tobytes()], run.tag)
    return {"name": shard_name(k), "tokens": int(sizes.sum()), "documents": len(sizes),
            "checksum": checksum, "index_checksum": index_checksum}


def _write_shard(run: _Run, k: int, results: Iterator[PieceTokens], count: int) -> dict:
    """Shard k of both splits from the next `count` pieces; its record for the state file."""
    train_lengths: list[np.ndarray] = []
    held_tokens: list[bytes] = []
    held_lengths: list[np.ndarray] = []
    digests: list[str] = []
    p = run.progress

    def train_tokens() -> Iterator[bytes]:
        for _ in range(count):
            piece = next(results)
            held = held_out(p.documents, len(piece.lengths), run.every)
            in_held = np.repeat(held, piece.lengths)
            train_lengths.append(piece.lengths[~held])
            held_lengths.append(piece.lengths[held])
            held_tokens.append(piece.tokens[in_held].tobytes())
            digests.append(piece.digest.hex())
            p.documents += len(piece.lengths)
            p.tokens += len(piece.tokens)
            p.bytes_read += piece.size
            run.tick()
            yield piece.tokens[~in_held].tobytes()

    train = _shard_entry(run, "train", k, train_tokens(), lambda: train_lengths)
    heldout = _shard_entry(run, "heldout", k, held_tokens, lambda: held_lengths)
    return {"train": train, "heldout": heldout, "pieces": digests}


def _split_single_document(run: _Run, records: list[dict], holdout: float) -> None:
    """One document and nothing held out: hold out its tail instead (the document is in
    memory here, once, as the prepare of a one-document dataset)."""
    k = next(i for i, r in enumerate(records) if r["train"]["documents"] == 1)
    tokens = np.frombuffer(store.read(run.dest / "train" / f"{shard_name(k)}.bin"), run.dtype)
    text = len(tokens) - 1  # its eod last
    if text < 2:
        return
    cut = text - max(1, int(text * holdout))
    eod = tokens[-1:]
    train = np.concatenate((tokens[:cut], eod))
    records[k]["train"] = _shard_entry(run, "train", k, [train.tobytes()],
                                       lambda: [np.array([len(train)])])
    records[k]["heldout"] = _shard_entry(run, "heldout", k, [tokens[cut:].tobytes()],
                                         lambda: [np.array([len(tokens) - cut])])


def _read_json(where: Location) -> dict | None:
    try:
        return json.loads(store.read(where))
    except (FileNotFoundError, ValueError):
        return None


def _finished(dest: Location, fingerprint: str) -> list[dict]:
    """The shards a killed prepare of the same inputs finished (their files all there)."""
    state = _read_json(dest / STATE)
    if not state or state.get("fingerprint") != fingerprint:
        return []
    listed = {split: store.sizes(dest / split) for split in SPLITS}
    records = []
    for record in state["shards"]:
        name = record["train"]["name"]
        if not all(f"{name}.{ext}" in listed[split] for split in SPLITS for ext in ("bin", "idx")):
            break
        records.append(record)
    return records


def fingerprint(files: Sequence[SourceFile], tokenizer: Tokenizer, holdout: float,
                shard_bytes: int) -> str:
    """What the output depends on: the sources (paths, sizes, versions), the tokenizer, the
    held-out fraction and the shard size."""
    return xxhash.xxh3_128_hexdigest(json.dumps([
        FORMAT_VERSION, [[f.path, f.kind, f.field, f.size, f.version] for f in files],
        tokenizer.sha256, holdout, shard_bytes]).encode())


def _manifest(files: Sequence[SourceFile], tokenizer: Tokenizer, run: _Run, holdout: float,
              fp: str, records: list[dict], todo: Sequence[Piece]) -> dict:
    digests = [bytes.fromhex(d) for r in records for d in r["pieces"]]
    by_file: dict[SourceFile, list[bytes]] = {}
    for piece, digest in zip(todo, digests, strict=True):
        by_file.setdefault(piece.file, []).append(digest)
    splits = {}
    for split in SPLITS:
        shards = [r[split] for r in records]
        splits[split] = {"tokens": sum(s["tokens"] for s in shards),
                         "documents": sum(s["documents"] for s in shards), "shards": shards}
    return {
        "format": FORMAT, "version": FORMAT_VERSION, "fingerprint": fp,
        "sources": [{"path": f.path, "kind": f.kind, "field": f.field, "size": f.size,
                     "checksum": file_checksum(by_file[f])} for f in files],
        "tokenizer": {"name": tokenizer.name, "sha256": tokenizer.sha256,
                      "vocab_size": tokenizer.vocab_size, "eod": tokenizer.eod},
        "dtype": run.dtype.name, "holdout": holdout, "splits": splits,
    }


def prepare(sources: list[SourceSpec], tokenizer: str, out: str, *, holdout: float = 0.01,
            roots: Sequence[str] = (), workers: int = 0,
            progress: Callable[[PrepareProgress], None] | None = None,
            shard_bytes: int = SHARD_BYTES) -> dict:
    """Tokenise `sources` (confined to `roots`, if any) into token shards under `out` (a
    folder or an object-store URL); the manifest, written last. A prepare of the same inputs
    that was killed resumes; one that finished returns its manifest at once."""
    if not 0 <= holdout < 1:
        raise DataError(f"holdout: {holdout} is not between 0 and 1")
    tok = load_tokenizer(tokenizer, roots)
    files = source_files(sources, roots)
    todo = pieces(files)
    fp = fingerprint(files, tok, holdout, shard_bytes)
    dest = location(out)
    done = _read_json(dest / MANIFEST)
    if done and done.get("fingerprint") == fp:
        return done
    if done:  # another dataset's (or older sources'): absent until this one is whole
        store.delete(dest / MANIFEST)
    return _prepare_into(dest, files, todo, tok, holdout, fp, shard_bytes, roots, workers,
                         progress or (lambda p: None))


def _prepare_into(dest: Location, files: Sequence[SourceFile], todo: Sequence[Piece],
                  tok: Tokenizer, holdout: float, fp: str, shard_bytes: int,
                  roots: Sequence[str], workers: int,
                  report: Callable[[PrepareProgress], None]) -> dict:
    groups = shard_groups(todo, shard_bytes)
    records = _finished(dest, fp)
    every = max(2, round(1 / holdout)) if holdout else 0
    run = _Run(dest, token_dtype(tok.vocab_size), every,
               PrepareProgress(bytes_total=sum(f.size for f in files), shards_total=len(groups)),
               report)
    p = run.progress
    first = sum(groups[: len(records)])
    p.bytes_read = p.bytes_resumed = sum(x.stop - x.start for x in todo[:first])
    for r in records:
        p.documents += r["train"]["documents"] + r["heldout"]["documents"]
        p.tokens += r["train"]["tokens"] + r["heldout"]["tokens"]
    p.shards_done = len(records)
    for split in SPLITS:
        store.make_folder(dest / split)
    run.tick(force=True)
    pool = _Workers(workers, tok, roots, todo[first:])
    try:
        results = pool.map(todo[first:])
        for k in range(len(records), len(groups)):
            records.append(_write_shard(run, k, results, groups[k]))
            _write(dest / STATE, [json.dumps({"fingerprint": fp, "shards": records}).encode()],
                   run.tag)
            p.shards_done += 1
            run.tick(force=True)
    finally:
        pool.close()
    if p.documents == 1 and every:
        _split_single_document(run, records, holdout)
    if not any(r["train"]["documents"] for r in records):
        raise DataError("train.dataset.paths: the dataset holds no text")
    manifest = _manifest(files, tok, run, holdout, fp, records, todo)
    _write(dest / MANIFEST, [json.dumps(manifest, indent=1).encode()], run.tag)
    store.delete(dest / STATE)
    return manifest
