"""A web process's start: wall time and peak memory of importing what the ASGI server loads.

    .venv/bin/python -m bench.web_footprint [--before /tmp/baseline] [--after .] [--runs 5]

Each run is a fresh interpreter of the tree's own venv (`<tree>/.venv/bin/python`, else this
one) with the platform's environment (platform/ and the tree on PYTHONPATH, ringside.settings),
timing `django.setup()` and the imports of `ringside.asgi`, `ringside.urls` and `jobs.api`
from the parent (interpreter start included) and reporting its own peak RSS
(`ru_maxrss`) and whether torch got loaded. With `--before`, runs alternate between the two
trees so that load on a shared machine hits both alike; medians are compared in `ratios`
(before over after: how many times faster, how many times smaller). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = """
import json, resource, sys
import django
django.setup()
import ringside.asgi, ringside.urls, jobs.api
print(json.dumps({"max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "torch": "torch" in sys.modules}))
"""


def run_once(tree: Path) -> dict:
    """One web-process start in `tree`: wall seconds, peak RSS (MiB), torch loaded."""
    venv = tree / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "platform"), str(tree)]),
           "DJANGO_SETTINGS_MODULE": "ringside.settings"}
    started = time.perf_counter()
    done = subprocess.run([python, "-c", SCRIPT], env=env, cwd=tree, capture_output=True,
                          text=True, check=True)
    wall = time.perf_counter() - started
    return {"start_s": wall, **json.loads(done.stdout.strip().splitlines()[-1])}


def summary(runs: list[dict]) -> dict:
    return {"start_s": [round(r["start_s"], 3) for r in runs],
            "max_rss_mb": [round(r["max_rss_mb"], 1) for r in runs],
            "median_start_s": round(statistics.median(r["start_s"] for r in runs), 3),
            "median_max_rss_mb": round(statistics.median(r["max_rss_mb"] for r in runs), 1),
            "torch_loaded": any(r["torch"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="the old source tree (default: none)")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the new source tree (default: this one)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    trees = {"after": args.after.resolve()}
    if args.before:
        trees = {"before": args.before.resolve(), **trees}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():
            runs[name].append(run_once(tree))
    result = {"runs": args.runs, "trees": {name: str(tree) for name, tree in trees.items()},
              **{name: summary(found) for name, found in runs.items()}}
    if args.before:
        before, after = result["before"], result["after"]
        result["ratios"] = {
            "start_before_over_after": round(before["median_start_s"] / after["median_start_s"], 2),
            "max_rss_before_over_after": round(
                before["median_max_rss_mb"] / after["median_max_rss_mb"], 2),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
