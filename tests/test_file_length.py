"""No module in platform/ is longer than 500 lines: one that is holds more than one kind of
thing and wants splitting by what they are (generated migrations excepted)."""

from __future__ import annotations

from pathlib import Path

from tests.test_function_length import sources

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 500


def long_files(root: Path) -> list[str]:
    found = []
    for path in sources(root):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > LIMIT:
            found.append(f"{path.relative_to(root)} ({lines} lines)")
    return found


def test_no_module_in_the_platform_is_longer_than_500_lines():
    assert long_files(ROOT / "platform") == []


def test_a_module_over_the_limit_is_named_with_its_length(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "app" / "short.py").write_text("x = 1\n" * LIMIT)
    (tmp_path / "app" / "migrations").mkdir()
    (tmp_path / "app" / "migrations" / "0001_initial.py").write_text("x = 1\n" * (LIMIT * 2))
    assert long_files(tmp_path) == [f"app/long.py ({LIMIT + 1} lines)"]
