"""The raw text a dataset is prepared from: files or globs of text (a file is one document),
JSONL (one document per line, a string field) or Parquet (a string column), on local disk
under the data roots or under an object-store prefix the roots allow; and the built-in corpus,
the standard library's own sources, which every machine has without a download.

Files are read in pieces so that worker processes tokenise one large file side by side: a
JSONL file in pieces of `PIECE_BYTES` (a piece holds the lines that start in it), a text or
Parquet file whole. Each piece's bytes are hashed as they are read; a file's checksum is the
xxh3-128 of its pieces' xxh3-128 digests, so it costs no second pass.
"""

from __future__ import annotations

import io
import json
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import xxhash

from engine.checkpoint.store import filesystem, location
from engine.contract import is_url
from engine.errors import DataError, SpecError
from engine.runtime.confine import NO_MATCH, expand, open_confined, resolve

PIECE_BYTES = 16 << 20
_LINE_TAIL = 1 << 20  # read past a piece's end in steps of this, to finish its last line
Kind = Literal["text", "jsonl", "parquet"]


@dataclass
class SourceSpec:
    """Files (globs, or object-store prefixes) of one kind; `field` names the JSONL field or
    the Parquet column that holds the text."""

    kind: Kind
    paths: list[str]
    field: str = "text"


@dataclass(frozen=True)
class SourceFile:
    path: str  # its real path, or its URL
    kind: Kind
    field: str
    size: int
    version: str  # what changes when the file does: its mtime, an object's ETag
    spec_field: str  # the spec field that named it, for messages


@dataclass(frozen=True)
class Piece:
    file: SourceFile
    start: int  # bytes [start, stop) of the file; JSONL: the lines that start there
    stop: int


def stdlib_source_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "idlelib", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def stdlib_source() -> SourceSpec:
    """The built-in corpus: each standard-library source file a document."""
    return SourceSpec("text", [str(p) for p in stdlib_source_files()])


def source_files(sources: Sequence[SourceSpec], roots: Sequence[str] = (),
                 field: str = "sources") -> list[SourceFile]:
    """Every file the sources name, in order (each glob's matches sorted); DataError naming
    `field.<n>` (the n-th path overall) for one outside the roots or matching nothing."""
    files: list[SourceFile] = []
    n = 0
    for source in sources:
        for pattern in source.paths:
            spec_field = f"{field}.{n}"
            n += 1
            try:
                found = (_remote_files(pattern, roots, spec_field) if is_url(pattern)
                         else _local_files(pattern, roots, spec_field))
            except SpecError as e:
                raise DataError(str(e)) from e
            files += [SourceFile(path, source.kind, source.field, size, version, spec_field)
                      for path, size, version in found]
    return files


def _local_files(pattern: str, roots: Sequence[str], field: str) -> list[tuple[str, int, str]]:
    found = []
    for path in expand(pattern, roots, field):
        stat = path.stat()
        found.append((str(path.resolve()) if roots else str(path), stat.st_size,
                      str(stat.st_mtime_ns)))
    return found


def _remote_files(pattern: str, roots: Sequence[str], field: str) -> list[tuple[str, int, str]]:
    """The objects a URL names: a glob's matches, everything under a prefix, or one object."""
    resolve(pattern, roots, field)
    where = location(pattern)
    fs = filesystem(where)
    protocol, _, key = pattern.partition("://")
    try:
        entries = fs.glob(key, detail=True) if any(c in key for c in "*?[") else (
            fs.find(key, detail=True) if fs.isdir(key) else {key: fs.info(key)})
    except FileNotFoundError:
        entries = {}
    found = []
    for name, info in sorted(entries.items()):
        url = f"{protocol}://{name}"
        if info.get("type") != "file":
            continue
        if roots:
            resolve(url, roots, field)
        version = str(info.get("ETag") or info.get("LastModified") or info.get("mtime"))
        found.append((url, int(info.get("size") or 0), version))
    if not found:
        raise SpecError({field: NO_MATCH if roots else f"no object matches {pattern!r}"})
    return found


def pieces(files: Sequence[SourceFile]) -> list[Piece]:
    """The pieces the files are read in, in order."""
    out = []
    for f in files:
        step = PIECE_BYTES if f.kind == "jsonl" else max(f.size, 1)
        out += [Piece(f, start, min(start + step, f.size)) for start in range(0, max(f.size, 1), step)]
    return out


def _open(file: SourceFile, roots: Sequence[str]) -> BinaryIO:
    if is_url(file.path):
        resolve(file.path, roots, file.spec_field)
        return filesystem(location(file.path)).open(file.path.partition("://")[2], "rb")
    return open_confined(file.path, roots, file.spec_field)


def read_piece(piece: Piece, roots: Sequence[str] = ()) -> tuple[list[str], bytes]:
    """The documents of a piece (empty ones dropped) and the digest of its bytes."""
    try:
        with _open(piece.file, roots) as f:
            if piece.file.kind != "jsonl":
                data = f.read()
                digest = xxhash.xxh3_128_digest(data)
                return _whole_file_documents(piece.file, data), digest
            return _jsonl_piece(f, piece)
    except SpecError as e:
        raise DataError(str(e)) from e
    except OSError as e:
        raise DataError(f"{piece.file.spec_field}: cannot read {piece.file.path!r} ({e})") from e


def _whole_file_documents(file: SourceFile, data: bytes) -> list[str]:
    if file.kind == "text":
        return [data.decode("utf-8", errors="replace")] if data else []
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(data), columns=[file.field])
    except (pa.ArrowException, KeyError) as e:
        raise DataError(f"train.dataset.field: {file.path} has no column {file.field!r} "
                        f"({e})") from e
    column = table.column(file.field)
    if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
        raise DataError(f"train.dataset.field: {file.path} column {file.field!r} "
                        f"is {column.type}, not text")
    return [t for t in column.to_pylist() if t]


def _jsonl_piece(f: BinaryIO, piece: Piece) -> tuple[list[str], bytes]:
    """The JSONL records whose lines start in the piece's bytes (a line that straddles its
    end is read to its end; one that began before its start belongs to the piece before)."""
    begin = max(piece.start - 1, 0)
    f.seek(begin)
    data = f.read(piece.stop - begin)
    digest = xxhash.xxh3_128_digest(data[piece.start - begin:])
    if piece.stop < piece.file.size and not data.endswith(b"\n"):
        data += _rest_of_line(f)
    first = 0 if piece.start == 0 else data.find(b"\n") + 1 or len(data)
    return _records(data[first:], piece, begin + first), digest


def _rest_of_line(f: BinaryIO) -> bytes:
    parts = []
    while more := f.read(_LINE_TAIL):
        newline = more.find(b"\n")
        parts.append(more if newline < 0 else more[: newline + 1])
        if newline >= 0:
            break
    return b"".join(parts)


def _records(text: bytes, piece: Piece, at: int) -> list[str]:
    """The documents of JSONL `text`, which starts at byte `at` of the file."""
    documents = []
    for line in io.BytesIO(text):
        line_at, at = at, at + len(line)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise DataError(f"train.dataset.paths: {piece.file.path} at byte {line_at} "
                            f"is not JSON ({e})") from e
        value = record.get(piece.file.field) if isinstance(record, dict) else None
        if not isinstance(value, str):
            raise DataError(f"train.dataset.field: {piece.file.path} at byte {line_at} has "
                            f"no string field {piece.file.field!r}")
        if value:
            documents.append(value)
    return documents


def iter_documents(files: Sequence[SourceFile], roots: Sequence[str] = ()) -> Iterator[str]:
    """Every document of the files, in order (one process; `prepare` spreads the pieces)."""
    for piece in pieces(files):
        yield from read_piece(piece, roots)[0]


def file_checksum(piece_digests: Sequence[bytes]) -> str:
    return xxhash.xxh3_128_hexdigest(b"".join(piece_digests))
