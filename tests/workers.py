"""The suite in two processes (`pytest -n 2`, pytest-xdist), one waiting on an engine, a
worker or a page while the other computes (on two cores both mostly compute: measured, two
processes take about as long as one; the README gives the times).

Each test file goes whole to one process (`FileScheduling`), so its module fixtures (a world
of spawned ranks, say) are made once; the files that build network namespaces, which belong
to the whole machine, go to one process together, one after the other. The files go out the
longest first, by the seconds a recent run took (tests/durations.json; refresh it with
`python -m tests.workers <junit xml of a full run>`), so that no long browser test starts
while the other process has nothing left. Each process keeps its
own state: a test database (pytest-django's suffix), Redis databases (`worker_index`) and the
platform's var folder (the SQLite file, the cache that holds the login and API throttles, the
embedded Redis of `serve`), set here before Django reads its settings: this module is a plugin
(`-p tests.workers` in pyproject.toml), loaded ahead of pytest-django.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

NAMESPACE_FILES = frozenset({
    "tests/bench/test_cluster.py",
    "tests/engine/runtime/test_launch_multi_node.py",
    "tests/platform/hosts/test_cluster.py",
    "tests/platform/jobs/test_multi_host.py",
})


ROOT = Path(__file__).resolve().parents[1]
DURATIONS = Path(__file__).with_name("durations.json")
SECONDS_PER_NEW_TEST = 1.0  # a file the durations do not know yet: about the suite's mean


def file_of(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return "network namespaces" if path in NAMESPACE_FILES else path


def worker_index() -> int:
    """0 in a run of one process, else this process's number."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["RINGSIDE_VAR_DIR"] = str(ROOT / "var" / f"test-{os.environ['PYTEST_XDIST_WORKER']}")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    # xdist's own loadgroup marks groups by rewriting a node id attribute that pytest 9 no
    # longer reads, so the grouping is done here, in the scheduler
    from xdist.scheduler import LoadScopeScheduling

    seconds = json.loads(DURATIONS.read_text())

    class FileScheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return file_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the first assignment: the whole queue is known
                self.workqueue = collections.OrderedDict(sorted(
                    self.workqueue.items(),
                    key=lambda item: -seconds.get(item[0], SECONDS_PER_NEW_TEST * len(item[1]))))
                self.ordered = True
            super()._assign_work_unit(node)

    return FileScheduling(config, log)


def seconds_per_file(junit_xml: Path) -> dict[str, float]:
    """Each scheduled file's seconds in a run's JUnit XML (setup, call and teardown)."""
    seconds: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit_xml).iter("testcase"):
        seconds[file_of(_path_of(case.get("classname", "")))] += float(case.get("time", 0))
    return {name: round(total, 1) for name, total in sorted(seconds.items())}


def _path_of(classname: str) -> str:
    """`tests.a.test_b` or `tests.a.test_b.TestC` -> `tests/a/test_b.py`."""
    parts = classname.split(".")
    while parts and not (ROOT / f"{'/'.join(parts)}.py").exists():
        parts.pop()
    return f"{'/'.join(parts)}.py"


if __name__ == "__main__":
    DURATIONS.write_text(json.dumps(seconds_per_file(Path(sys.argv[1])), indent=1) + "\n")
