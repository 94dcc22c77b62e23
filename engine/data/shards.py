"""Read a prepared dataset (engine.data.prepare's layout) without loading it.

Each split is a `ShardSpan`: its shards' tokens seen as one stream. A local shard is memory-
mapped, so a rank's memory is the page cache the ranks of a host share, never a copy; a shard
in an object store is read in ranged blocks through a small cache that fetches the next block
ahead. Opening checks every file's size against the manifest (a truncated or missing shard is
a DataError, never silent garbage); `verify=True` also checks every checksum (xxh3-128, about
8 GB/s of a core, on top of reading the files once).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import xxhash

from engine.checkpoint import store
from engine.checkpoint.store import Location, Url, location
from engine.data.prepare import FORMAT, FORMAT_VERSION, MANIFEST, SPLITS
from engine.data.span import MixSource
from engine.errors import DataError, SpecError
from engine.runtime.confine import open_confined, resolve

BLOCK_BYTES = 1 << 20  # one ranged read from an object store
CACHE_BLOCKS = 128  # blocks a process keeps (128 MiB)
_HASH_CHUNK = 64 << 20


class _BlockCache:
    """Ranged reads of objects in blocks, shared by every remote shard of the process (at
    most `CACHE_BLOCKS` kept, the least recently used dropped). Windows are drawn at random,
    so a read fetches only its own blocks; the block after is fetched ahead, in the
    background, only when a read ends in the second half of a block (a reader going through
    it in order); `prefetch` fetches the blocks of ranges the loader will read next."""

    def __init__(self) -> None:
        self.blocks: OrderedDict[tuple[Url, int], Future[bytes]] = OrderedDict()
        self.lock = threading.Lock()
        self.ahead = ThreadPoolExecutor(max_workers=8, thread_name_prefix="shard-read-ahead")

    def fetch(self, where: Url, size: int, b: int) -> Future[bytes]:
        with self.lock:
            found = self.blocks.get((where, b))
            if found is None:
                start = b * BLOCK_BYTES
                found = self.ahead.submit(store.read, where, start,
                                          min(start + BLOCK_BYTES, size))
                self.blocks[(where, b)] = found
            self.blocks.move_to_end((where, b))
            while len(self.blocks) > CACHE_BLOCKS:
                self.blocks.popitem(last=False)
            return found

    def prefetch(self, where: Url, size: int, start: int, stop: int) -> None:
        for b in range(start // BLOCK_BYTES, (stop - 1) // BLOCK_BYTES + 1):
            self.fetch(where, size, b)

    def read(self, where: Url, size: int, start: int, stop: int) -> bytes:
        first, last = start // BLOCK_BYTES, (stop - 1) // BLOCK_BYTES
        parts = [self.fetch(where, size, b) for b in range(first, last + 1)]
        if stop - last * BLOCK_BYTES > BLOCK_BYTES // 2 and (last + 1) * BLOCK_BYTES < size:
            self.fetch(where, size, last + 1)
        data = b"".join(p.result() for p in parts)
        return data[start - first * BLOCK_BYTES : stop - first * BLOCK_BYTES]


_BLOCKS = _BlockCache()


class _Remote:
    """A shard's tokens in an object store, read through the process's block cache."""

    def __init__(self, where: Url, size: int):
        self.where, self.size = where, size

    def read(self, start: int, stop: int) -> bytes:
        return _BLOCKS.read(self.where, self.size, start, stop)

    def prefetch(self, start: int, stop: int) -> None:
        _BLOCKS.prefetch(self.where, self.size, start, stop)


class _Shard:
    """One shard of one split: its tokens and its document index."""

    def __init__(self, dataset: PreparedDataset, split: str, entry: dict):
        self.entry = entry
        self.tokens = int(entry["tokens"])
        self.documents = int(entry["documents"])
        self.dtype = dataset.dtype
        self.bin = dataset.where / split / f"{entry['name']}.bin"
        self.idx = dataset.where / split / f"{entry['name']}.idx"
        self.label = f"{dataset.name}: {split}/{entry['name']}"
        sizes = (self.tokens * self.dtype.itemsize, self.documents * 8)
        self._tokens = dataset.map(self.bin, sizes[0], self.dtype, self.label)
        self._starts: np.ndarray | None = None
        if isinstance(self._tokens, np.ndarray):  # local: the index is mapped too
            self._starts = dataset.map(self.idx, sizes[1], np.dtype("<i8"), self.label)
        else:
            dataset.check_size(self.idx, sizes[1], self.label)

    def read(self, start: int, stop: int) -> np.ndarray:
        if isinstance(self._tokens, np.ndarray):
            return self._tokens[start:stop]
        size = self.dtype.itemsize
        return np.frombuffer(self._tokens.read(start * size, stop * size), self.dtype)

    def prefetch(self, start: int, stop: int) -> None:
        size = self.dtype.itemsize
        if isinstance(self._tokens, _Remote):
            self._tokens.prefetch(start * size, stop * size)

    def starts(self) -> np.ndarray:
        if self._starts is None:  # remote: the index is small, fetched whole on first use
            self._starts = np.frombuffer(store.read(self.idx), "<i8")
        return self._starts

    def verify(self, dataset: PreparedDataset) -> None:
        for where, expected in ((self.bin, self.entry["checksum"]),
                                (self.idx, self.entry["index_checksum"])):
            if dataset.checksum(where) != expected:
                raise DataError(f"{self.label}: {where.name} does not match its checksum: "
                                f"the dataset is damaged; prepare it again")


class ShardSpan:
    """One split: its shards' tokens as one stream (engine.data.span.TokenSpan)."""

    def __init__(self, shards: list[_Shard]):
        self.shards = [s for s in shards if s.tokens]
        self.offsets = np.cumsum([0] + [s.tokens for s in self.shards])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, window: slice) -> torch.Tensor:
        """`read` as a slice (a loader that slices a tensor reads a span alike)."""
        return self.read(window.start or 0, len(self) if window.stop is None else window.stop)

    def _overlaps(self, start: int, stop: int) -> list[tuple[_Shard, int, int, int]]:
        """(shard, its first offset, start and stop within it) for each shard in range."""
        start, stop = max(start, 0), min(stop, len(self))
        found = []
        i = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while start < stop:
            base = int(self.offsets[i])
            end = min(stop, int(self.offsets[i + 1]))
            found.append((self.shards[i], base, start - base, end - base))
            start, i = end, i + 1
        return found

    def read(self, start: int, stop: int) -> torch.Tensor:
        parts = [shard.read(a, b) for shard, _, a, b in self._overlaps(start, stop)]
        if not parts:
            return torch.empty(0, dtype=torch.long)
        return torch.from_numpy(np.concatenate(parts).astype(np.int64))

    def prefetch(self, start: int, stop: int) -> None:
        """Fetch tokens [start, stop) in the background (an object store's; a local shard is
        the page cache's to keep)."""
        for shard, _, a, b in self._overlaps(start, stop):
            shard.prefetch(a, b)

    def doc_starts(self, start: int, stop: int) -> torch.Tensor:
        found = []
        for shard, base, a, b in self._overlaps(start, stop):
            starts = shard.starts()
            lo, hi = np.searchsorted(starts, a), np.searchsorted(starts, b)
            found.append(starts[lo:hi] + base)
        if not found:
            return torch.empty(0, dtype=torch.long)
        return torch.from_numpy(np.concatenate(found).astype(np.int64))


class PreparedDataset:
    """A prepared dataset's manifest and splits; `open` it."""

    def __init__(self, where: Location, manifest: dict, roots: Sequence[str], field: str,
                 name: str, manifest_sha256: str = ""):
        self.where, self.manifest, self.roots, self.field = where, manifest, roots, field
        self.name, self.manifest_sha256 = name, manifest_sha256
        self._listings: dict[Location, dict[str, int]] = {}
        tokenizer = manifest["tokenizer"]
        self.vocab_size: int = tokenizer["vocab_size"]
        self.eod: int = tokenizer["eod"]
        self.dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
        self._splits = {split: ShardSpan([_Shard(self, split, entry)
                                          for entry in manifest["splits"][split]["shards"]])
                        for split in SPLITS}

    @classmethod
    def open(cls, path_or_url: str, verify: bool = False, roots: Sequence[str] = (),
             field: str = "train.data.mix") -> PreparedDataset:
        """The dataset prepared at a folder or URL (under `roots`, if any); DataError naming
        `field` if it is not there or not whole, or (verify) not what its manifest says."""
        where = location(path_or_url)
        name = where.name
        if roots and isinstance(where, Path):
            where = Path(os.path.realpath(where))
        try:
            text = _read_confined(where / MANIFEST, roots, field)
            manifest = json.loads(text)
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError) as e:
            raise DataError(f"{field}: {path_or_url} holds no prepared dataset (no whole "
                            f"{MANIFEST}: not prepared, or its prepare has not finished)") from e
        if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
            raise DataError(f"{field}: {path_or_url} is not a dataset this engine reads "
                            f"(format {manifest.get('format')} {manifest.get('version')})")
        dataset = cls(where, manifest, roots, field, name, hashlib.sha256(text).hexdigest())
        if verify:
            dataset.verify()
        return dataset

    def split(self, name: str) -> ShardSpan:
        return self._splits[name]

    def source(self, name: str = "", weight: float = 1.0) -> MixSource:
        return MixSource(name=name or self.name, weight=weight, train=self.split("train"),
                         heldout=self.split("heldout"), vocab_size=self.vocab_size,
                         eod=self.eod, manifest_sha256=self.manifest_sha256,
                         tokenizer_sha256=self.manifest["tokenizer"].get("sha256", ""))

    def verify(self) -> None:
        """Every shard's checksum; DataError naming the first that does not match."""
        for span in self._splits.values():
            for shard in span.shards:
                shard.verify(self)

    def map(self, where: Location, size: int, dtype: np.dtype,
            label: str) -> np.ndarray | _Remote:
        """A local file memory-mapped, a remote one behind a block cache; its size checked."""
        if isinstance(where, Url):
            self.check_size(where, size, label)
            return _Remote(where, size)
        try:
            f = _open(where, self.roots, self.field)
        except FileNotFoundError:
            _check(None, size, where, label)
        with f:
            _check(os.fstat(f.fileno()).st_size, size, where, label)
            if size == 0:
                return np.empty(0, dtype)
            return np.memmap(f, dtype=dtype, mode="r")

    def check_size(self, where: Location, size: int, label: str) -> None:
        listed = self._listing(where.parent if isinstance(where, Path) else
                               Url(where.text.rpartition("/")[0]))
        _check(listed.get(where.name), size, where, label)

    def _listing(self, folder: Location) -> dict[str, int]:
        if folder not in self._listings:
            self._listings[folder] = store.sizes(folder)
        return self._listings[folder]

    def checksum(self, where: Location) -> str:
        hasher = xxhash.xxh3_128()
        if isinstance(where, Url):
            size = self._listing(Url(where.text.rpartition("/")[0]))[where.name]
            for start in range(0, size, _HASH_CHUNK):
                hasher.update(store.read(where, start, min(start + _HASH_CHUNK, size)))
            return hasher.hexdigest()
        with _open(where, self.roots, self.field) as f:
            while chunk := f.read(_HASH_CHUNK):
                hasher.update(chunk)
        return hasher.hexdigest()


def _check(found: int | None, expected: int, where: Location, label: str) -> None:
    if found is None:
        raise DataError(f"{label}: {where.name} is missing: the dataset is incomplete; "
                        f"prepare it again")
    if found != expected:
        raise DataError(f"{label}: {where.name} holds {found} bytes where its manifest says "
                        f"{expected}: the dataset is truncated or damaged; prepare it again")


def _open(where: Path, roots: Sequence[str], field: str):  # noqa: ANN202 (a binary file)
    try:
        return open_confined(where, roots, field)
    except SpecError as e:
        raise DataError(str(e)) from e


def _read_confined(where: Location, roots: Sequence[str], field: str) -> bytes:
    if isinstance(where, Url):
        try:
            resolve(str(where), roots, field)
        except SpecError as e:
            raise DataError(str(e)) from e
        return store.read(where)
    with _open(where, roots, field) as f:
        return f.read()
