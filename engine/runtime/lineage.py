"""What made a checkpoint: the code, the spec, the data and the checkpoints it came from.

Every save records a small JSON document (its `lineage`) in the checkpoint's manifest meta and
on its `checkpoint` event; an export copies it into the model folder (engine.export). It holds
the code version (the git commit of the engine's checkout, else the package version), the
spec's hash, each source's prepared-dataset manifest hash, tokenizer hash and tokens trained on,
and the chain of parents, newest first: each the checkpoint this timeline continued from and
how — "resume" (this job's own checkpoint, after a restart), "clone" (another job's, through
`resume_from`), "rollback" (the checkpoint gone back to) or "init_from" (`model.init_from`).
A parent's own parents follow it, read from its lineage, so the chain survives every link.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.data.span import MixSource
from engine.runtime.spec import JobSpec

# spec fields that change no trained value: a clone's new name keeps the spec's hash
_VOLATILE = ("name",)
_ENGINE_CHECKOUT = Path(__file__).resolve().parents[2]


@functools.cache
def code_version() -> str:
    """"git:<commit>" of the checkout the engine runs from, else "ringside <version>"."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_ENGINE_CHECKOUT,
                                capture_output=True, text=True, timeout=10, check=True)
        return f"git:{commit.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):  # not a checkout, or no git
        try:
            return f"ringside {metadata.version('ringside')}"
        except metadata.PackageNotFoundError:
            return "unknown"


def spec_sha256(spec: JobSpec) -> str:
    """sha256 of the spec's canonical JSON (sorted keys, no spaces), its volatile fields out."""
    data = {k: v for k, v in spec.to_dict().items() if k not in _VOLATILE}
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


@dataclass(frozen=True)
class Parent:
    """A checkpoint (or exported folder) a timeline continued from."""

    kind: str  # "resume" | "clone" | "rollback" | "init_from"
    path: str
    step: int | None
    lineage: dict[str, Any] | None  # the parent's own, where it recorded one

    def chain(self) -> list[dict[str, Any]]:
        """This link, then the parent's own parents."""
        return [{"kind": self.kind, "path": self.path, "step": self.step},
                *(self.lineage or {}).get("parents", [])]


class Lineage:
    """One run's lineage, from `parent` (its `model.init_from`) if any; `record` gives a save's
    document."""

    def __init__(self, spec: JobSpec, sources: Sequence[MixSource], parent: Parent | None = None):
        self.code_version, self.spec_sha256 = code_version(), spec_sha256(spec)
        self.sources = [{"name": s.name, "manifest_sha256": s.manifest_sha256,
                         "tokenizer_sha256": s.tokenizer_sha256} for s in sources]
        self.parents: list[dict[str, Any]] = parent.chain() if parent is not None else []

    def descend(self, parent: Parent) -> None:
        """From now on the timeline continues from `parent` (what came before it is its own)."""
        self.parents = parent.chain()

    def record(self, step: int, source_tokens: Sequence[int]) -> dict[str, Any]:
        return {
            "code_version": self.code_version,
            "spec_sha256": self.spec_sha256,
            "step": step,
            "sources": [{**source, "tokens": int(tokens)}
                        for source, tokens in zip(self.sources, source_tokens, strict=True)],
            "parents": list(self.parents),
        }
