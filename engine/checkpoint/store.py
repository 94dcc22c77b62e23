"""Where checkpoints live: a local folder (a shared filesystem every host mounts is one) or an
object store URL such as `s3://bucket/prefix`, all reached through one fsspec filesystem.

A location is a `Path` for a local folder, else a `Url`; both join with `/` and have `.name`,
so the layout code reads the same for either. Object stores have no rename, so nothing here
relies on one for correctness: a file is written whole (a local file under a temporary name,
fsynced and renamed, as before; an object by one upload, which becomes visible only once
complete), and a checkpoint exists once its manifest does, which is written last.

The s3 endpoint and credentials come from the environment, as botocore and fsspec read them:
AWS_ENDPOINT_URL (or FSSPEC_S3_ENDPOINT_URL), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_DEFAULT_REGION.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import fsspec
from fsspec import AbstractFileSystem

# `<protocol>:/...`: pathlib folds the `//` of a URL that went through Path() (an argparse
# `type=Path`, a `Path(job.resume_from)`), so `s3:/bucket/key` is read as `s3://bucket/key`
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]+):/+(.*)$")
_LOCAL_PROTOCOLS = ("file", "local")
# O_DIRECT needs the buffer, offsets and sizes aligned to the device's blocks: a buffer aligned
# to this is written straight from memory by `write_buffer`
ALIGNMENT = 4096
_CHUNK = 32 << 20  # large enough for the disk's full speed, small enough to overlap


@dataclass(frozen=True, order=True)
class Url:
    """A location in an object store, e.g. `s3://bucket/prefix/step-000010`."""

    text: str

    def __truediv__(self, name: str) -> Url:
        return Url(f"{self.text.rstrip('/')}/{name}")

    @property
    def name(self) -> str:
        return self.text.rstrip("/").rpartition("/")[2]

    @property
    def protocol(self) -> str:
        return self.text.partition("://")[0]

    def __str__(self) -> str:
        return self.text


Location = Path | Url


def location(where: str | os.PathLike[str] | Url) -> Location:
    """The location `where` names: a `Url` for a remote fsspec protocol, else a local `Path`."""
    if isinstance(where, Url):
        return where
    text = os.fspath(where)
    found = _URL.match(text)
    if found is None:
        return Path(text)
    protocol, rest = found.group(1).lower(), found.group(2)
    if protocol in _LOCAL_PROTOCOLS:
        return Path("/" + rest)
    if protocol not in fsspec.available_protocols():
        return Path(text)
    return Url(f"{protocol}://{rest}")


def filesystem(where: Location) -> AbstractFileSystem:
    """The fsspec filesystem of a location. Listings are never cached: other ranks and hosts
    write the same folders, and a stale listing would hide their parts and manifests."""
    if isinstance(where, Path):
        return fsspec.filesystem("file")
    return fsspec.filesystem(where.protocol, use_listings_cache=False)


def _key(where: Location) -> str:
    return str(where) if isinstance(where, Path) else where.text.partition("://")[2]


def sizes(folder: Location) -> dict[str, int]:
    """name -> size of the files directly in `folder` (empty if there is no such folder)."""
    try:
        entries = filesystem(folder).ls(_key(folder), detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {e["name"].rstrip("/").rpartition("/")[2]: int(e.get("size") or 0)
            for e in entries if e.get("type") == "file"}


def children(folder: Location) -> list[Location]:
    """Everything directly in `folder` (files and folders)."""
    try:
        names = filesystem(folder).ls(_key(folder), detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [folder / n.rstrip("/").rpartition("/")[2] for n in names]


def exists(where: Location) -> bool:
    return filesystem(where).exists(_key(where))


def read(where: Location, start: int | None = None, end: int | None = None) -> bytes:
    """The bytes of a file, or only [start, end): one ranged request on an object store."""
    return filesystem(where).cat_file(_key(where), start=start, end=end)


def write(where: Location, chunks: Iterable[memoryview | bytes], tmp_tag: str) -> None:
    """Write a file so that it is either absent/old or complete (and, locally, durable)."""
    if isinstance(where, Url):
        f = filesystem(where).open(_key(where), "wb")  # the object appears when close() ends
        try:
            for chunk in chunks:
                f.write(chunk)
        except BaseException:
            f.discard()  # abort the multipart upload: no partial object (a `with` would commit)
            raise
        f.close()
        return
    tmp = where.with_name(f".{where.name}.{tmp_tag}.tmp")
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, where)


def write_buffer(where: Location, data: memoryview, tmp_tag: str) -> None:
    """`write` for one large buffer (a rank's data file), in large sequential writes: locally
    straight from memory to the disk where the filesystem allows it (O_DIRECT: no copy into
    the page cache, and no dirty pages left for the fsync to flush), else through the page
    cache; one fsync either way."""
    if isinstance(where, Url):
        write(where, [data], tmp_tag)
        return
    tmp = where.with_name(f".{where.name}.{tmp_tag}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = _write_direct(tmp, data)
        while done < len(data):
            done += os.pwrite(fd, data[done : done + _CHUNK], done)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, where)


def _write_direct(path: Path, data: memoryview) -> int:
    """Write the leading whole pages of `data` to `path` with O_DIRECT; how many bytes it
    wrote (0 where O_DIRECT is refused: tmpfs, some network filesystems, an unaligned
    buffer). The caller writes the rest through the page cache and fsyncs."""
    aligned = len(data) // ALIGNMENT * ALIGNMENT
    if aligned == 0 or data.readonly or not hasattr(os, "O_DIRECT"):
        return 0
    if ctypes.addressof(ctypes.c_char.from_buffer(data)) % ALIGNMENT:
        return 0
    try:
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    except OSError:
        return 0
    try:
        done = 0
        while done < aligned:
            done += os.pwrite(fd, data[done : min(aligned, done + _CHUNK)], done)
    except OSError:  # e.g. a filesystem that opens with O_DIRECT but refuses the write
        return 0
    finally:
        os.close(fd)
    return done


def make_folder(folder: Location) -> None:
    """Create a folder (object stores have none: their keys need no parent)."""
    if isinstance(folder, Path):
        folder.mkdir(parents=True, exist_ok=True)


def sync_folder(folder: Location) -> None:
    """Make a folder's new names durable (local only: an object is durable once uploaded)."""
    if isinstance(folder, Path):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def delete(where: Location) -> None:
    """Delete a file if it is there."""
    try:
        filesystem(where).rm_file(_key(where))
    except FileNotFoundError:
        pass


def delete_tree(folder: Location) -> None:
    """Delete a folder and everything in it, quietly (another rank may be deleting it too)."""
    if isinstance(folder, Path):
        shutil.rmtree(folder, ignore_errors=True)
        return
    try:
        filesystem(folder).rm(_key(folder), recursive=True)
    except FileNotFoundError:
        pass
