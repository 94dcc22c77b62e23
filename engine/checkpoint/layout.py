"""On-disk layout of a checkpoint, its manifest, integrity checks, listing, pinning, retention.

A checkpoint directory holds one folder per saved step:

    step-000120/
      <save_id>.rank-00003.bin    this rank's shard bytes, then its pickled extras
      <save_id>.rank-00003.json   this rank's part: where each shard sits, block checksums
      MANIFEST.json               written last, by whichever rank finishes last
      PINNED                      present when a person pinned the checkpoint

The manifest is what makes a checkpoint exist: every file is written under a temporary name,
fsynced and renamed before it, so a crash at any point leaves either the previous manifest
(and the previous files it names, which are never overwritten because file names carry the
save id) or the new one. Each data file carries a CRC-32 per 4 MiB block, so a reader can
check exactly the bytes it reads without reading whole files (zlib.crc32 runs at ~6 GB/s
here, against ~2 GB/s for sha256).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
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
    return f"{save_id}.rank-{rank:05d}.bin"


def part_file_name(save_id: str, rank: int) -> str:
    return f"{save_id}.rank-{rank:05d}.json"


def block_crcs(data: memoryview) -> list[int]:
    return [zlib.crc32(data[i : i + BLOCK_BYTES]) for i in range(0, len(data), BLOCK_BYTES)]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, chunks: list[memoryview | bytes], tmp_tag: str) -> None:
    """Write `chunks` to `path` so that `path` is either absent/old or complete and durable."""
    tmp = path.with_name(f".{path.name}.{tmp_tag}.tmp")
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class CheckpointInfo:
    """One checkpoint folder as found on disk (or in the memory tier)."""

    path: Path
    step: int
    good: bool
    problem: str = ""  # why it is not good
    pinned: bool = False
    size: int = 0  # bytes of shard data, all ranks
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


def inspect(path: str | os.PathLike[str], verify: bool = False) -> CheckpointInfo:
    """Read one checkpoint folder's manifest and check its files.

    The quick check (always) needs a readable manifest and every data file present with its
    exact size, which catches a missing manifest, a lost rank and truncation. `verify=True`
    also reads every byte and compares the block checksums (finds flipped bytes up front; the
    loader checks the blocks it reads in any case).
    """
    path = Path(path)
    match = _STEP_DIR.match(path.name)
    info = CheckpointInfo(path=path, step=int(match.group(1)) if match else -1, good=False)
    info.pinned = (path / PINNED).exists()
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        if manifest.get("format") != FORMAT_VERSION:
            info.problem = f"manifest format {manifest.get('format')!r}, expected {FORMAT_VERSION}"
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
        problem = _check_data_file(path / part["file"], part, verify)
        if problem:
            info.problem = problem
            return info
    info.good = True
    return info


def _check_data_file(file: Path, part: dict[str, Any], verify: bool) -> str:
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        return f"missing file {file.name}"
    if size != part["nbytes"]:
        return f"{file.name} has {size} bytes, the manifest says {part['nbytes']} (truncated)"
    if not verify:
        return ""
    with open(file, "rb") as f:
        for i, expected in enumerate(part["crc32"]):
            if zlib.crc32(f.read(BLOCK_BYTES)) != expected:
                return f"{file.name} block {i} fails its checksum (bytes altered)"
    return ""


def list_checkpoints(
    directory: str | os.PathLike[str], verify: bool = False
) -> list[CheckpointInfo]:
    """Every step folder in `directory`, oldest first, each with whether it is good."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [inspect(p, verify) for p in directory.iterdir() if _STEP_DIR.match(p.name)]
    return sorted(found, key=lambda info: info.step)


def find_latest_good(
    *directories: str | os.PathLike[str], verify: bool = False
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


def pin(checkpoint: str | os.PathLike[str]) -> None:
    """Keep this checkpoint regardless of retention until unpinned."""
    path = Path(checkpoint)
    if not (path / MANIFEST).exists():
        raise CheckpointError(f"cannot pin {path}: no checkpoint there (no {MANIFEST})")
    (path / PINNED).touch()


def unpin(checkpoint: str | os.PathLike[str]) -> None:
    Path(checkpoint, PINNED).unlink(missing_ok=True)


def remove(checkpoint: str | os.PathLike[str]) -> None:
    """Delete a checkpoint folder, manifest first so that it stops existing atomically."""
    path = Path(checkpoint)
    (path / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def apply_retention(directory: str | os.PathLike[str], keep: int, newest_step: int) -> None:
    """Keep the `keep` newest good checkpoints plus pinned ones; drop leftovers of failed saves.

    Only folders older than `newest_step` (the one just committed) are candidates, so saves
    still in flight for later steps are never touched.
    """
    infos = [i for i in list_checkpoints(directory) if i.step <= newest_step]
    good = [i for i in infos if i.good]
    kept = {i.path for i in good[-keep:]} if keep > 0 else set()
    for info in infos:
        if info.path not in kept and not info.pinned:
            remove(info.path)


def abandon_newer(directory: str | os.PathLike[str], step: int) -> list[int]:
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
        aside = Path(directory, "abandoned", f"{info.path.name}-{info.manifest.get('save_id')}")
        aside.parent.mkdir(exist_ok=True)
        if not aside.exists():
            try:
                os.rename(info.path, aside)
            except FileNotFoundError:  # another rank moved it first
                pass
    return dropped
