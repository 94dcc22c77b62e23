"""Finding one checkpoint by step or by name over a run's tiers (memory, then disk): the one
lookup behind a policy rollback, a user's rollback and a resume after a restart."""

from __future__ import annotations

import os
from collections.abc import Iterable

from engine.checkpoint.layout import CheckpointInfo, list_checkpoints
from engine.checkpoint.store import Url


def find(directories: Iterable[str | os.PathLike[str] | Url], *, step: int | None = None,
         name: str | None = None) -> CheckpointInfo | None:
    """The good checkpoint named `name` (its step folder's name or path), else the newest one
    at or before `step`; None if none matches. At equal steps the earlier directory wins, so
    pass the memory tier first."""
    good = [c for d in directories for c in list_checkpoints(d) if c.good]
    if name:
        chosen = [c for c in good if name in (c.path.name, str(c.path))]
    else:
        chosen = [c for c in good if step is not None and c.step <= step]
    return max(chosen, key=lambda c: c.step, default=None)

