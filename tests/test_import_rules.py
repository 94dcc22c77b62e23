"""Which of our modules the platform's may import: of the engine, only its public modules; of
each other, in one direction between any two apps, and the project package (`ringside`) from no
app. Imports are counted as tests/test_imports.py counts them (module level and inside functions
alike, not under `if TYPE_CHECKING:`).
"""

from __future__ import annotations

from pathlib import Path

from tests.test_imports import ROOT, SOURCE_ROOTS, import_graph

# The engine modules the platform imports -> why each is public; anything else it needs is
# re-exported through one of them (docs/architecture.md, "Two programs and a seam"). The
# engine's commands (`python -m engine.train`, the launcher; engine.export, engine.evaluate,
# engine.data.prepare_pipe) are run in processes of their own, never imported, so none is here.
ENGINE_PUBLIC = {
    "engine.contract": "what crosses the seam, typed: events, commands, states, the vocabulary",
    "engine.runtime.spec": "the job spec and its rules: a spec the API accepts is one that runs",
    "engine.runtime.events": "the bus: the Redis streams events and commands travel on",
    "engine.paro.planner": "the layouts and step times the launch form and admission offer",
}


# The platform's top-level packages -> those each may import. `ringside`, the project, wires the
# apps (URLs, websocket routes, settings, the Celery app) and is imported by none: an app reads
# settings through django.conf and sends tasks through celery's current_app. `common` is what
# every app may use and imports none. Between two apps the arrow points at the one built on:
# monitoring watches jobs and hosts, jobs are placed on hosts, datasets are mixed into jobs.
# Where the lower app needs the higher one it declares an interface the higher one provides
# (jobs.mixtures, provided by datasets; jobs.telemetry, by monitor) or sends a signal.
ALLOWED_APP_IMPORTS = {
    "common": set(),
    "hosts": {"common"},
    "jobs": {"common", "hosts"},
    "datasets": {"common", "jobs"},
    "monitor": {"common", "hosts", "jobs"},
    "ringside": {"common", "datasets", "hosts", "jobs", "monitor"},
}
def platform_imports(roots: dict[Path, str] = SOURCE_ROOTS) -> dict[str, set[str]]:
    """Each platform module (each not the engine's) -> the modules of ours it imports."""
    return {module: found for module, found in import_graph(roots).items()
            if _package(module) != "engine"}


def engine_imports_outside_public(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> engine module` for each import of an engine module outside the public set."""
    return sorted(f"{module} -> {target}" for module, found in graph.items() for target in found
                  if target.split(".")[0] == "engine" and target not in ENGINE_PUBLIC)


def imports_against_the_arrows(graph: dict[str, set[str]]) -> set[str]:
    """`importer -> imported` for each import between two of the platform's packages that
    ALLOWED_APP_IMPORTS does not allow."""
    return {f"{module} -> {target}" for module, found in graph.items() for target in found
            if _package(module) in ALLOWED_APP_IMPORTS and _package(target) != _package(module)
            and _package(target) in ALLOWED_APP_IMPORTS
            and _package(target) not in ALLOWED_APP_IMPORTS[_package(module)]}


def _package(module: str) -> str:
    return module.split(".")[0]


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
    assert engine_imports_outside_public(platform_imports({tmp_path: ""})) == [
        "jobs.launch -> engine.ports", "jobs.pkg -> engine.runtime"]


def test_imports_between_the_apps_go_one_way_and_no_app_imports_the_project():
    found = imports_against_the_arrows(platform_imports())
    assert not found, "imports against the arrows:\n" + "\n".join(sorted(found))


def test_every_package_of_the_platform_has_its_arrows():
    packages = {path.parent.name for path in (ROOT / "platform").glob("*/__init__.py")}
    assert packages == set(ALLOWED_APP_IMPORTS)


def test_an_import_against_the_arrows_is_found(tmp_path):
    files = {
        "hosts/__init__.py": "",
        "hosts/worker.py": "from jobs.backends.slurm import QUEUE\n",  # up the arrows
        "jobs/__init__.py": "",
        "jobs/backends/__init__.py": "",
        "jobs/backends/slurm.py": "from common import text\nfrom hosts import worker\n",
        "jobs/dispatch.py": "def send():\n    from ringside.celery import app\n",  # the project
        "common/__init__.py": "",
        "common/text.py": "",
        "ringside/__init__.py": "",
        "ringside/celery.py": "",
        "ringside/urls.py": "import jobs.dispatch\nimport hosts.worker\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert imports_against_the_arrows(platform_imports({tmp_path: ""})) == {
        "hosts.worker -> jobs.backends.slurm", "jobs.dispatch -> ringside.celery"}
