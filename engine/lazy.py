"""Lazy package exports (PEP 562): a package's `__init__` names what it exports and which of
its modules defines it, and that module is imported on first use of the name.

So `from engine.paro.planner import plan` (torch-free) does not import ShardedDataParallel
(torch) through `engine/paro/__init__`, while `from engine.paro import ShardedDataParallel`
keeps working for the training code.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, modules: dict[str, tuple[str, ...]]
) -> tuple[list[str], Callable[[str], Any]]:
    """`__all__` and `__getattr__` for `package`; `modules` maps each of its modules (the name
    relative to the package) to the names it exports."""
    owner = {name: f"{package}.{module}" for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in owner:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(owner[name]), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    return sorted(owner), __getattr__
