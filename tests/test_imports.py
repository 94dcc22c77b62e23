"""No import cycles among our own modules (engine/ and the platform's source root).

Every `import` and `from ... import` counts, at module level and inside functions alike (a
function-level import that closes a cycle only moves the failure to the first call), except
under `if TYPE_CHECKING:`, which never runs. `from pkg import name` imports the submodule
`pkg.name` when there is one, else `pkg` (its `__init__`). A cycle is a strongly connected
component of more than one module; a module importing itself does not count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# source roots and the module-name prefix of each: platform/ is on sys.path itself
SOURCE_ROOTS = {ROOT / "engine": "engine", ROOT / "platform": ""}


def module_names(roots: dict[Path, str]) -> dict[str, Path]:
    """Every module under the roots by dotted name; a package's `__init__` is the package."""
    modules = {}
    for root, prefix in roots.items():
        for path in sorted(root.rglob("*.py")):
            parts = prefix.split(".") if prefix else []
            parts += path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_modules(path: Path, module: str, modules: dict[str, Path]) -> set[str]:
    """Our modules that `module` (at `path`) imports anywhere in its code."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in _runnable_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {_known(alias.name, modules) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `.` is this module's package, `..` its parent
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(p for p in [*parts, base] if p)
            found |= {_known(f"{base}.{alias.name}", modules) for alias in node.names}
    return found - {None, module}


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of dotted `name` that is one of our modules, if any: `a.b.func` is
    module `a.b`, `from a import b` is `a.b` when that is a module, else `a`."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _runnable_nodes(node: ast.AST) -> Iterator[ast.AST]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for branch in child.orelse:
                yield branch
                yield from _runnable_nodes(branch)
            continue
        yield child
        yield from _runnable_nodes(child)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(roots: dict[Path, str]) -> dict[str, set[str]]:
    """Each of our modules -> the modules of ours it imports."""
    modules = module_names(roots)
    return {name: imported_modules(path, name, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_our_modules_import_no_cycles():
    found = cycles(import_graph(SOURCE_ROOTS))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_cycles_are_found_through_every_kind_of_import(tmp_path):
    files = {
        "pkg/__init__.py": "from pkg import a\n",  # the package imports submodule `a`
        "pkg/a.py": "def f():\n    from .b import g\n",  # a function-level relative import
        "pkg/b.py": "import pkg\nimport pkg.b\n",  # back to the package; itself: no cycle
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.d\n",
        "pkg/d.py": "from pkg.c import thing\n",  # `thing` is no module: imports pkg.c
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph({tmp_path: ""})
    assert graph["pkg.d"] == {"pkg.c"} and graph["pkg.c"] == set()
    assert cycles(graph) == [["pkg", "pkg.a", "pkg.b"]]
