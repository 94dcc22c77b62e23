"""Which of our modules the platform's may import: of the engine, only its public modules; of
each other, in one direction between any two apps. Imports are counted as tests/test_imports.py
counts them (module level and inside functions alike, not under `if TYPE_CHECKING:`).
"""

from __future__ import annotations

from tests.test_imports import SOURCE_ROOTS, import_graph

# The engine modules the platform imports, and why each is public; anything else it needs is
# re-exported through one of them (docs/architecture.md, "The seam"). The engine's commands
# (`python -m engine.train`, the launcher; engine.export, engine.evaluate,
# engine.data.prepare_pipe) are run, never imported, and load torch, so none is here.
ENGINE_PUBLIC = {
    # what crosses the seam, typed: events, commands, states, the vocabulary, checkpoint tiers
    "engine.contract": "the seam's types",
    # the job spec and its rules, so a spec the API accepts is one the engine runs
    "engine.runtime.spec": "the spec's rules",
    # the Redis streams the engine publishes events to and reads commands from
    "engine.runtime.events": "the bus",
    # the layouts and predicted step times the launch form and admission offer before a launch
    "engine.paro.planner": "the planner",
}


def platform_imports() -> dict[str, set[str]]:
    """Each platform module -> the modules of ours it imports."""
    graph = import_graph(SOURCE_ROOTS)
    return {module: found for module, found in graph.items() if not module.startswith("engine")}


def engine_imports_outside_public(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> engine module` for each import of an engine module outside the public set."""
    return sorted(f"{module} -> {target}" for module, found in graph.items() for target in found
                  if target.split(".")[0] == "engine" and target not in ENGINE_PUBLIC)


def test_the_platform_imports_only_the_engines_public_modules():
    found = engine_imports_outside_public(platform_imports())
    assert not found, "platform modules importing engine internals:\n" + "\n".join(found)


def test_an_engine_import_outside_the_public_set_is_found(tmp_path):
    files = {
        "engine/__init__.py": "",
        "engine/contract.py": "",
        "engine/ports.py": "",
        "engine/runtime/__init__.py": "",
        "engine/runtime/spec.py": "",
        "jobs/__init__.py": "",
        "jobs/ok.py": "from engine import contract\nfrom engine.runtime.spec import parse_spec\n",
        "jobs/launch.py": "def f():\n    from engine.ports import free_port\n",
        "jobs/pkg.py": "import engine.runtime\n",  # the package itself is no public module
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = {module: found for module, found in import_graph({tmp_path: ""}).items()
             if not module.startswith("engine")}
    assert engine_imports_outside_public(graph) == ["jobs.launch -> engine.ports",
                                                    "jobs.pkg -> engine.runtime"]
