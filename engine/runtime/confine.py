"""The files a job may read: its dataset, tokenizer and `model.init_from`, confined to the data
roots the platform gives it (`data.roots` in the spec it writes).

A path counts by its real path (symlinks and `..` resolved) against each root's real path; an
object-store URL by its prefix. The platform checks when it validates the spec and the engine
again when it opens the file, so a path swapped for a symlink in between is still refused; a
file is opened at its checked real path and the open file's own path is checked once more, so
a swap between the check and the open is caught too. A refusal never says whether anything
exists outside the roots. Without roots (the engine's own command line, one user's tool)
every path is read as given.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from engine.contract import is_url
from engine.errors import SpecError

OUTSIDE = "not under your data roots"
SERVER_PATH = "<server path>"
# an absolute path in a message: a slash that starts a word, up to a separator
ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])/[^\s'\"(),:;<>\[\]{}|*?]+")
NO_MATCH = "no file under your data roots matches it"


def is_under(path: str, roots: Sequence[str]) -> bool:
    """Whether `path` (a local path, resolved to its real path, or a URL) lies in one of
    `roots` (folders, or URL prefixes)."""
    if is_url(path):
        if "/../" in f"{path}/" or "/./" in f"{path}/":
            return False
        return any(is_url(r) and (path == r.rstrip("/") or path.startswith(r.rstrip("/") + "/"))
                   for r in roots)
    real = os.path.realpath(path)
    for root in roots:
        if is_url(root):
            continue
        top = os.path.realpath(root)
        if os.path.commonpath([real, top]) == top:
            return True
    return False


def resolve(path: str, roots: Sequence[str], field: str) -> str:
    """`path` as the job reads it: its real path (a URL as it is), if in the roots; else
    SpecError naming `field`. No roots: `path` unchanged."""
    if not roots:
        return path
    if not is_under(path, roots):
        raise SpecError({field: OUTSIDE})
    return path if is_url(path) else os.path.realpath(path)


def glob_base(pattern: str) -> str:
    """The literal folder a glob starts from: its components before the first wildcard."""
    parts = Path(pattern).parts
    first = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    return str(Path(*parts[:first])) if first else "."


def expand(pattern: str, roots: Sequence[str], field: str) -> list[Path]:
    """The files a dataset glob matches, sorted; SpecError naming `field` if it starts outside
    the roots or matches a file outside them, or matches none."""
    if roots:
        resolve(glob_base(pattern), roots, field)
    matched = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    if roots and any(not is_under(str(p), roots) for p in matched):
        raise SpecError({field: OUTSIDE})
    if not matched:
        raise SpecError({field: NO_MATCH if roots else f"no file matches {pattern!r}"})
    return matched


def open_confined(path: str | Path, roots: Sequence[str], field: str) -> BinaryIO:
    """`path` opened for reading (binary), at its checked real path; SpecError naming `field`
    if it is outside the roots, even if it was swapped for a symlink after the check."""
    real = resolve(str(path), roots, field)
    f = open(real, "rb")  # noqa: SIM115 (the caller closes it)
    if roots and not is_under(_opened_path(f, real), roots):
        f.close()
        raise SpecError({field: OUTSIDE})
    return f


def _opened_path(f: BinaryIO, fallback: str) -> str:
    """The file an open descriptor refers to (Linux: /proc/self/fd), else the path opened."""
    try:
        return os.readlink(f"/proc/self/fd/{f.fileno()}")
    except OSError:
        return fallback


def scrub_paths(text: str, visible: Sequence[str]) -> str:
    """`text` with every absolute path outside the `visible` folders replaced by a
    placeholder: the server's layout (the install, its libraries, other jobs) is not a user's
    to read in the messages of their job."""
    def replace(found: re.Match) -> str:
        path = os.path.normpath(found.group())
        inside = any(not is_url(folder) and os.path.commonpath([path, folder]) == folder
                     for folder in visible)
        return found.group() if inside else SERVER_PATH
    return ABSOLUTE_PATH.sub(replace, text)
