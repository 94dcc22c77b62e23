"""Web, Celery and `migrate` processes never import torch: a fresh interpreter set up as the
platform's processes are imports every module they load at start, validates a spec and plans
its layouts as the launch form does, and still has no torch.

On failure the message names the chain of modules through which torch was first imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from common.services import child_env

ROOT = Path(__file__).resolve().parent.parent

# Reports the modules being imported when torch is first asked for, outermost first.
SCRIPT = """
import json, sys, traceback

class FirstTorchImport:
    chain = None

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and FirstTorchImport.chain is None:
            frames = [f.f_globals.get("__name__", "") for f, _ in traceback.walk_stack(None)]
            chain = [m for m in reversed(frames) if m and not m.startswith("importlib")]
            FirstTorchImport.chain = [m for i, m in enumerate(chain) if m not in chain[:i]]
        return None

sys.meta_path.insert(0, FirstTorchImport())
import django
django.setup()
import ringside.asgi, ringside.urls, ringside.celery, jobs.api, jobs.tasks, monitor.api
# what the launch form asks of a web process: validate a spec, plan its layouts
from engine.horing.topology import Topology
from engine.moe.config import preset
from engine.paro.planner import DEFAULT_LINKS, plan
from engine.runtime.spec import parse_spec
parse_spec({"name": "n", "model": {"preset": "small"}, "parallel": {"nodes": 2,
            "procs_per_node": 2, "strategy": "IIG"}})
assert plan(preset("small"), Topology(2, 2), 80e9, 1, DEFAULT_LINKS)
print(json.dumps({"torch": "torch" in sys.modules, "chain": FirstTorchImport.chain}))
"""


def test_the_platforms_processes_start_validate_and_plan_without_importing_torch():
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=child_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert not found["torch"], "torch imported via " + " -> ".join(found["chain"] or ["?"])
