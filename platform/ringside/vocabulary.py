"""The seam's vocabulary for the frontend: `frontend/static/js/vocabulary.js`, an ES module
with one frozen object per enum of engine.contract (`ActionName.REFUSED === "refused"`), so
the pages name kinds, actions, tiers and states as the engine does; and `SpecDefaults`, the
scalar defaults of the spec's `train` and `parallel` sections (engine.runtime.spec), which a
page falls back on for a field the user's spec leaves out. Written by `manage.py vocabulary`;
a test fails when it is stale."""

from __future__ import annotations

import dataclasses
import json
from enum import StrEnum

from django.conf import settings

from engine.contract import ActionName, AnomalyKind, CheckpointTier, CommandKind, Header, JobState
from engine.runtime.spec import ParallelSpec, TrainSpec

ENUMS: tuple[type[StrEnum], ...] = (AnomalyKind, ActionName, CheckpointTier, CommandKind,
                                    Header, JobState)
MODULE_PATH = settings.REPO_ROOT / "frontend" / "static" / "js" / "vocabulary.js"


def vocabulary_module() -> str:
    """The text of vocabulary.js for the contract as it is."""
    lines = ["// The names that cross the engine/platform seam, from engine/contract.py, and the",
             "// spec's defaults, from engine/runtime/spec.py.",
             "// Written by `manage.py vocabulary` (platform/ringside/vocabulary.py): do not edit."]
    for enum in ENUMS:
        members = json.dumps({name: m.value for name, m in enum.__members__.items()}, indent=2)
        lines.append(f"export const {enum.__name__} = Object.freeze({members});")
    defaults = json.dumps({"train": _scalar_defaults(TrainSpec),
                           "parallel": _scalar_defaults(ParallelSpec)}, indent=2)
    lines.append(f"export const SpecDefaults = Object.freeze({defaults});")
    return "\n".join(lines) + "\n"


def _scalar_defaults(section: type) -> dict[str, int | float | str | bool]:
    return {f.name: f.default for f in dataclasses.fields(section)
            if isinstance(f.default, int | float | str | bool)}
