"""Read a prepared dataset (engine.data.prepare's layout) without loading it.

Each split is a `ShardSpan`: its shards' tokens seen as one stream. A local shard is memory-
mapped, so a rank's memory is the page cache the ranks of a host share, never a copy; a shard
in an object store is read in ranged blocks through a small cache that fetches the next block
ahead. Opening checks every file's size against the manifest (a truncated or missing shard is
a DataError, never silent garbage); `verify=True` also checks every checksum (xxh3-128, about
8 GB/s of a core, on top of reading the files once).
"""

from __future__ import annotations

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

BLOCK_BYTES = 4 << 20  # one ranged read from an object store
CACHE_BLOCKS = 16  # blocks a remote shard keeps (64 MiB)
_HASH_CHUNK = 64 << 20


class _BlockCache:
    """Ranged reads of one object, in blocks, the least recently used dropped, the block
    after each one read fetched ahead in the background (reads are mostly sequential within
    a window, and windows are drawn at random, so one block ahead is enough)."""

    _ahead = ThreadPoolExecutor(max_workers=4, thread_name_prefix="shard-read-ahead")

    def __init__(self, where: Url, size: int):
        self.where, self.size = where, size
        self.blocks: OrderedDict[int, Future[bytes]] = OrderedDict()
        self.lock = threading.Lock()

    def _fetch(self, b: int) -> Future[bytes]:
        with self.lock:
            found = self.blocks.get(b)
            if found is None:
                start = b * BLOCK_BYTES
                found = self._ahead.submit(store.read, self.where, start,
                                           min(start + BLOCK_BYTES, self.size))
                self.blocks[b] = found
            self.blocks.move_to_end(b)
            while len(self.blocks) > CACHE_BLOCKS:
                self.blocks.popitem(last=False)
            return found

    def read(self, start: int, stop: int) -> bytes:
        first, last = start // BLOCK_BYTES, (stop - 1) // BLOCK_BYTES
        parts = [self._fetch(b) for b in range(first, last + 1)]
        if (last + 1) * BLOCK_BYTES < self.size:
            self._fetch(last + 1)
        data = b"".join(p.result() for p in parts)
        return data[start - first * BLOCK_BYTES : stop - first * BLOCK_BYTES]


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
                 name: str):
        self.where, self.manifest, self.roots, self.field = where, manifest, roots, field
        self.name = name
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
            manifest = json.loads(_read_confined(where / MANIFEST, roots, field))
        except (FileNotFoundError, NotADirectoryError, ValueError) as e:
            raise DataError(f"{field}: {path_or_url} holds no prepared dataset (no whole "
                            f"{MANIFEST}: not prepared, or its prepare has not finished)") from e
        if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
            raise DataError(f"{field}: {path_or_url} is not a dataset this engine reads "
                            f"(format {manifest.get('format')} {manifest.get('version')})")
        dataset = cls(where, manifest, roots, field, name)
        if verify:
            dataset.verify()
        return dataset

    def split(self, name: str) -> ShardSpan:
        return self._splits[name]

    def source(self, name: str = "", weight: float = 1.0) -> MixSource:
        return MixSource(name=name or self.name, weight=weight, train=self.split("train"),
                         heldout=self.split("heldout"), vocab_size=self.vocab_size,
                         eod=self.eod)

    def verify(self) -> None:
        """Every shard's checksum; DataError naming the first that does not match."""
        for span in self._splits.values():
            for shard in span.shards:
                shard.verify(self)

    def map(self, where: Location, size: int, dtype: np.dtype,
            label: str) -> np.ndarray | _BlockCache:
        """A local file memory-mapped, a remote one behind a block cache; its size checked."""
        if isinstance(where, Url):
            self.check_size(where, size, label)
            return _BlockCache(where, size)
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
