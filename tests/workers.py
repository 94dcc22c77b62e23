"""The suite in two processes (`pytest -n 2`, pytest-xdist), one waiting on an engine, a
worker or a page while the other computes (on two cores both mostly compute: measured, two
processes take about as long as one; the README gives the times).

Each test file goes whole to one process (`FileScheduling`), so its module fixtures (a world
of spawned ranks, say) are made once; the files that build network namespaces, which belong
to the whole machine, go to one process together, one after the other. Each process keeps its
own state: a test database (pytest-django's suffix), Redis databases (`worker_index`) and the
platform's var folder (the SQLite file, the cache that holds the login and API throttles, the
embedded Redis of `serve`), set here before Django reads its settings: this module is a plugin
(`-p tests.workers` in pyproject.toml), loaded ahead of pytest-django.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

NAMESPACE_FILES = frozenset({
    "tests/bench/test_cluster.py",
    "tests/engine/runtime/test_launch_multi_node.py",
    "tests/platform/hosts/test_cluster.py",
    "tests/platform/jobs/test_multi_host.py",
})


def worker_index() -> int:
    """0 in a run of one process, else this process's number."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["RINGSIDE_VAR_DIR"] = str(
        Path(__file__).resolve().parents[1] / "var" / f"test-{os.environ['PYTEST_XDIST_WORKER']}")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    # xdist's own loadgroup marks groups by rewriting a node id attribute that pytest 9 no
    # longer reads, so the grouping is done here, in the scheduler
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return "network namespaces" if path in NAMESPACE_FILES else path

    return FileScheduling(config, log)
