"""On-disk layout of a checkpoint, its manifest, integrity checks, listing, pinning, retention.

A checkpoint directory holds one folder per saved step:

    step-000120/
      <save_id>.rank-00003.safetensors  this rank's shards and pickled extras (`shardfile`)
      <save_id>.rank-00003.json         this rank's part: where each shard sits, checksums
      MANIFEST.json               written last, by whichever rank finishes last
      PINNED                      present when a person pinned the checkpoint

The manifest is what makes a checkpoint exist: every file is written whole before it (see
`store.write`: locally under a temporary name, fsynced and renamed; in an object store by one
upload, no rename needed), so a crash at any point leaves either the previous manifest (and
the previous files it names, which are never overwritten because file names carry the save
id) or the new one. The directory may be a local folder or an `s3://bucket/prefix` URL
(`store`); everything here goes through `store`. Each data file carries a CRC-32 per 4 MiB
block of the whole file, so a reader can check exactly the bytes it reads without reading
whole files. The CRC is zlib's, computed by zlib-ng (SIMD: ~7 GB/s here, ~3x the standard
library's zlib.crc32 and its values, so every checkpoint written before still verifies).

Format 2 data files are safetensors files (readable by the `safetensors` package anywhere);
format 1 files (before: the raw shard bytes, then the extras) still load: the manifest gives
every shard's byte offset in its file either way, so one reader serves both.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from zlib_ng.zlib_ng import crc32

from engine.checkpoint import store
from engine.checkpoint.store import Location, Url

FORMAT_VERSION = 2
READABLE_FORMATS = (1, FORMAT_VERSION)
BLOCK_BYTES = 4 << 20
MANIFEST = "MANIFEST.json"
PINNED = "PINNED"
_STEP_DIR = re.compile(r"^step-(\d{6,})$")


class CheckpointError(Exception):
    """A checkpoint cannot be written or read as asked; the message names what and why."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint's files do not match its manifest (missing, truncated or altered bytes)."""


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def data_file_name(save_id: str, rank: int) -> str:
    return f"{save_id}.rank-{rank:05d}.safetensors"


def part_file_name(save_id: str, rank: int) -> str:
    return f"{save_id}.rank-{rank:05d}.json"


def block_crcs(data: memoryview) -> list[int]:
    return [crc32(data[i : i + BLOCK_BYTES]) for i in range(0, len(data), BLOCK_BYTES)]


@dataclass
class CheckpointInfo:
    """One checkpoint folder as found on disk, in an object store or in the memory tier."""

    path: Location
    step: int
    good: bool
    problem: str = ""  # why it is not good
    pinned: bool = False
    size: int = 0  # bytes of the data files, all ranks
    world_size: int = 0
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. strategy, nodes, procs_per_node
    manifest: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def strategy(self) -> str:
        return str(self.meta.get("strategy", ""))

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary, as the `checkpoint` event and the platform show it."""
        return {
            "step": self.step, "path": str(self.path), "size": self.size, "good": self.good,
            "problem": self.problem, "pinned": self.pinned, "strategy": self.strategy,
            "world_size": self.world_size, "meta": self.meta,
        }


def inspect(path: str | os.PathLike[str] | Url, verify: bool = False) -> CheckpointInfo:
    """Read one checkpoint folder's manifest and check its files.

    The quick check (always) needs a readable manifest and every data file present with its
    exact size, which catches a missing manifest, a lost rank and truncation. `verify=True`
    also reads every byte and compares the block checksums (finds flipped bytes up front; the
    loader checks the blocks it reads in any case).
    """
    path = store.location(path)
    match = _STEP_DIR.match(path.name)
    info = CheckpointInfo(path=path, step=int(match.group(1)) if match else -1, good=False)
    files = store.sizes(path)  # one listing: on an object store, one request
    info.pinned = PINNED in files
    try:
        if MANIFEST not in files:
            raise FileNotFoundError(MANIFEST)
        manifest = json.loads(store.read(path / MANIFEST))
        if manifest.get("format") not in READABLE_FORMATS:
            info.problem = (f"manifest format {manifest.get('format')!r}, expected one of "
                            f"{READABLE_FORMATS}")
            return info
        info.step, info.world_size = int(manifest["step"]), int(manifest["world_size"])
        info.meta = manifest["meta"]
        info.size = sum(part["nbytes"] for part in manifest["parts"])
    except FileNotFoundError:
        info.problem = "no manifest (incomplete: the save did not finish)"
        return info
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        info.problem = f"unreadable manifest: {e!r}"
        return info
    info.manifest = manifest
    for part in manifest["parts"]:
        problem = _check_data_file(path / part["file"], files.get(part["file"]), part, verify)
        if problem:
            info.problem = problem
            return info
    info.good = True
    return info


def _check_data_file(file: Location, size: int | None, part: dict[str, Any],
                     verify: bool) -> str:
    if size is None:
        return f"missing file {file.name}"
    if size != part["nbytes"]:
        return f"{file.name} has {size} bytes, the manifest says {part['nbytes']} (truncated)"
    if not verify:
        return ""
    for i, expected in enumerate(part["crc32"]):
        block = store.read(file, i * BLOCK_BYTES, min(size, (i + 1) * BLOCK_BYTES))
        if crc32(block) != expected:
            return f"{file.name} block {i} fails its checksum (bytes altered)"
    return ""


def list_checkpoints(
    directory: str | os.PathLike[str] | Url, verify: bool = False
) -> list[CheckpointInfo]:
    """Every step folder in `directory`, oldest first, each with whether it is good. A step
    folder without its manifest (a save in progress, or one that crashed) is listed as not
    good; on an object store such a "folder" is just the keys uploaded so far."""
    found = [inspect(p, verify) for p in store.children(store.location(directory))
             if _STEP_DIR.match(p.name)]
    return sorted(found, key=lambda info: info.step)


def find_latest_good(
    *directories: str | os.PathLike[str] | Url, verify: bool = False
) -> tuple[CheckpointInfo | None, list[CheckpointInfo]]:
    """The newest good checkpoint across `directories` and the bad ones newer than it.

    At equal steps the earlier directory wins, so pass the memory tier first. The skipped
    list is what the training loop reports as anomalies (each has `.problem`).
    """
    candidates = [
        (info.step, -order, info)
        for order, d in enumerate(directories)
        for info in list_checkpoints(d, verify)
    ]
    skipped = []
    for _, _, info in sorted(candidates, key=lambda c: c[:2], reverse=True):
        if info.good:
            return info, skipped
        skipped.append(info)
    return None, skipped


def present(checkpoint: str | os.PathLike[str] | Url) -> bool:
    """Whether a checkpoint (a step folder, local or a URL) still exists: its manifest is
    there. One request on an object store; `inspect` also checks every file."""
    return store.exists(store.location(checkpoint) / MANIFEST)


def pin(checkpoint: str | os.PathLike[str] | Url) -> None:
    """Keep this checkpoint regardless of retention until unpinned."""
    path = store.location(checkpoint)
    if not store.exists(path / MANIFEST):
        raise CheckpointError(f"cannot pin {path}: no checkpoint there (no {MANIFEST})")
    store.write(path / PINNED, [b""], "pin")


def unpin(checkpoint: str | os.PathLike[str] | Url) -> None:
    store.delete(store.location(checkpoint) / PINNED)


def remove(checkpoint: str | os.PathLike[str] | Url) -> None:
    """Delete a checkpoint folder, manifest first so that it stops existing atomically."""
    path = store.location(checkpoint)
    store.delete(path / MANIFEST)
    store.delete_tree(path)


def apply_retention(directory: str | os.PathLike[str] | Url, keep: int, newest_step: int) -> None:
    """Keep the `keep` newest good checkpoints plus pinned ones; drop leftovers of failed saves.

    Only folders older than `newest_step` (the one just committed) are candidates, so saves
    still in flight for later steps are never touched; a folder without its manifest goes only
    once it is older than every kept checkpoint, as an older save may still be completing
    (a memory tier's replicated parts arrive from another host, engine.checkpoint.replica).
    """
    infos = [i for i in list_checkpoints(directory) if i.step <= newest_step]
    good = [i for i in infos if i.good]
    kept = good[-keep:] if keep > 0 else []
    oldest_kept = kept[0].step if kept else newest_step + 1
    for info in infos:
        if info in kept or info.pinned or (not info.good and info.step > oldest_kept):
            continue
        remove(info.path)


def abandon_newer(directory: str | os.PathLike[str] | Url, step: int) -> list[int]:
    """After a rollback to `step`, later checkpoints hold an abandoned timeline that must never
    be resumed: unpinned ones are deleted, pinned ones move to `abandoned/` (kept for the
    person who pinned them, out of the resume candidates). Returns the steps dropped."""
    dropped = []
    for info in list_checkpoints(directory):
        if info.step <= step:
            continue
        dropped.append(info.step)
        if not info.pinned:
            remove(info.path)
            continue
        aside = store.location(directory) / "abandoned"
        _move(info.path, aside / f"{info.path.name}-{info.manifest.get('save_id')}")
    return dropped


def _move(checkpoint: Location, aside: Location) -> None:
    """Move a checkpoint folder where no resume looks. Locally one rename; an object store has
    none, so the files are copied, the manifest last, and the original removed manifest first:
    at every moment each copy either is a whole checkpoint or has no manifest."""
    if store.exists(aside / MANIFEST):
        return
    if isinstance(checkpoint, Url):
        names = sorted(store.sizes(checkpoint), key=lambda name: name == MANIFEST)
        for name in names:
            store.write(aside / name, [store.read(checkpoint / name)], "move")
        remove(checkpoint)
        return
    store.make_folder(aside.parent)
    try:
        os.rename(checkpoint, aside)
    except FileNotFoundError:  # another rank moved it first
        pass
