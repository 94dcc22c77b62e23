"""The lanes of `make test` and what each lane keeps to itself."""

import os
from urllib.parse import urlsplit, urlunsplit

# `make test` runs two lanes side by side (pytest-xdist, `--dist loadgroup`): the platform's
# job and browser tests, which mostly wait on engines, workers and pages, and everything else,
# which mostly computes. Within a lane tests run one at a time, in file order. The tests that
# build network namespaces (tests/bench/test_cluster.py, tests/platform/hosts,
# tests/engine/runtime/test_launch_multi_node.py) share one lane: namespaces are the host's.
PLATFORM_LANE = ("tests/platform/jobs/", "tests/e2e/")


def lane_of(nodeid: str) -> str:
    return "platform" if nodeid.split("::")[0].startswith(PLATFORM_LANE) else "compute"


def lane_index() -> int:
    """0 in a run without lanes, else this lane's worker number (its Redis databases are its
    own: job ids and names repeat across lanes)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))
