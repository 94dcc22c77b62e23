"""Host memory for checkpoints: the staging buffers a save copies into, huge pages for loads.

A staging buffer of CPU shards, where the checkpointer has a memory tier, is a file in the
memory tier's folder (`.staging-<id>`, locked while its process lives) that the buffer maps:
the memory tier's data file is then a hard link to it, so that tier costs no copy (on tmpfs
the copy, with allocating the file's pages, was the slowest part of a persist). Once
retention deletes that data file, the staging name is the file's only one again and the
buffer takes the next save; a buffer whose file is still a checkpoint's is never written
again. A staging file whose process died (no lock) is deleted by the next one created in the
folder. Elsewhere (GPU shards, which need pinned memory; no memory tier; a folder without
O_TMPFILE or without room) a buffer is anonymous memory and each tier's file is written
from it.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import uuid
import weakref
from pathlib import Path

import torch

from engine.checkpoint import store

_HUGE_PAGE = 2 << 20
_HEADROOM = 1 << 20  # a later save's extras may be a little longer: it still fits
_LIBC = ctypes.CDLL(None, use_errno=True)
_MADVISE = getattr(_LIBC, "madvise", None)
_AT_FDCWD, _AT_SYMLINK_FOLLOW = -100, 0x400  # Linux's; O_TMPFILE is Linux's too


class Staging:
    """One staging buffer of at least `nbytes`; file-backed in `folder` where it can be."""

    def __init__(self, nbytes: int, pinned: bool, folder: Path | None) -> None:
        self.capacity = nbytes + _HEADROOM
        self.name: Path | None = None
        self.fd = None if pinned or folder is None else self._create(folder)
        if self.fd is None:
            raw = torch.empty(self.capacity + store.ALIGNMENT, dtype=torch.uint8,
                              pin_memory=pinned)
            skip = -raw.data_ptr() % store.ALIGNMENT  # for store.write_buffer's O_DIRECT
            self.memory = raw[skip : skip + self.capacity]
            if not pinned:
                advise_huge_pages(self.memory)
        else:
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # no fault per page
            self.memory = torch.frombuffer(mmap.mmap(self.fd, self.capacity, flags=flags),
                                           dtype=torch.uint8)
        self._size = self.capacity

    @property
    def file_backed(self) -> bool:
        return self.fd is not None

    @property
    def reusable(self) -> bool:
        """Whether a save may write into it: its file, if any, has its staging name only (no
        checkpoint's data file is it; and no one deleted the folder under it)."""
        if self.fd is None:
            return True
        mine = os.fstat(self.fd)
        try:
            named = os.stat(self.name).st_ino == mine.st_ino  # type: ignore[arg-type]
        except FileNotFoundError:
            return False
        return named and mine.st_nlink == 1

    def close(self) -> None:
        """Let go of the buffer: its file's staging name (a checkpoint linked to it keeps it)."""
        if self.fd is not None:
            self._closed()

    def take(self, nbytes: int) -> torch.Tensor:
        """The first `nbytes` (at most `capacity`), for a save; the file is made that long,
        its pages allocated up front (a full tmpfs raises here, not SIGBUS in a copy)."""
        if self.fd is not None and nbytes != self._size:
            if nbytes < self._size:
                os.ftruncate(self.fd, nbytes)
            else:
                os.posix_fallocate(self.fd, self._size, nbytes - self._size)
            self._size = nbytes
        return self.memory[:nbytes]

    def link(self, where: Path) -> None:
        """Give the file (`take`'s bytes, written) the name `where` too: a checkpoint's data
        file in the memory tier, complete the moment it appears."""
        os.link(self.name, where)  # type: ignore[arg-type]

    def _create(self, folder: Path) -> int | None:
        """The open, locked, allocated staging file in `folder`; None where its filesystem
        has no O_TMPFILE or no room (the save then stages in anonymous memory). It is made
        nameless, locked, then named, so no sweep ever sees it unlocked."""
        if not hasattr(os, "O_TMPFILE"):
            return None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o644)  # as the data file it becomes
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.posix_fallocate(fd, 0, self.capacity)
            name = folder / f"{_STAGING_PREFIX}{uuid.uuid4().hex}"
            _link_open_file(fd, name)
        except OSError:
            os.close(fd)
            return None
        self.name = name
        self._closed = weakref.finalize(self, _close, fd, name)
        _sweep(folder)
        return fd


_STAGING_PREFIX = ".staging-"


def _link_open_file(fd: int, where: Path) -> None:
    """Name a nameless (O_TMPFILE) open file. os.link would link /proc's symlink itself:
    only linkat with AT_SYMLINK_FOLLOW reaches the file."""
    source = f"/proc/self/fd/{fd}".encode()
    if _LIBC.linkat(_AT_FDCWD, source, _AT_FDCWD, os.fsencode(where), _AT_SYMLINK_FOLLOW):
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error), str(where))


def _close(fd: int, name: Path) -> None:
    try:
        if os.stat(name).st_ino == os.fstat(fd).st_ino:
            os.unlink(name)
    except FileNotFoundError:
        pass
    os.close(fd)


def _sweep(folder: Path) -> None:
    """Delete the staging files in `folder` that no living process holds (a crashed run's)."""
    for path in folder.glob(f"{_STAGING_PREFIX}*"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # gone already, or another user's
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # held
        else:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)


def advise_huge_pages(memory: torch.Tensor) -> None:
    """Ask for transparent huge pages in the whole 2 MiB ranges of a CPU tensor's memory: a
    first write into fresh memory faults once per page, and in 4 KiB pages that costs ~4x
    the time (measured here: 0.22 s against 0.05 s of CPU per 256 MiB). Only the tensor's
    own pages are advised; a kernel without the advice (or with THP off) ignores it."""
    if _MADVISE is None or not hasattr(mmap, "MADV_HUGEPAGE"):
        return
    first = memory.data_ptr()
    start = -(-first // _HUGE_PAGE) * _HUGE_PAGE
    end = (first + memory.numel() * memory.element_size()) // _HUGE_PAGE * _HUGE_PAGE
    if end > start:
        _MADVISE(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_HUGEPAGE)
