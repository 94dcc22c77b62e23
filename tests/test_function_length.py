"""No function in engine/ or platform/ is longer than 60 lines: one that is wants splitting
into named steps (generated migrations excepted)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 60


def sources(root: Path) -> list[Path]:
    """The Python files under `root` that people write (generated migrations excepted)."""
    return [path for path in sorted(root.rglob("*.py")) if "migrations" not in path.parts]


def long_functions(root: Path) -> list[str]:
    found = []
    for path in sources(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > LIMIT:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                                 f"({length} lines)")
    return found


def test_no_function_in_the_engine_or_the_platform_is_longer_than_60_lines():
    assert long_functions(ROOT / "engine") + long_functions(ROOT / "platform") == []
