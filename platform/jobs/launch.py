"""The engine's processes for one launch of a job: its run folder, its command line (resuming
from the newest good checkpoint after the first launch), starting it in a process group of its
own, signalling that group, and the tail of its stderr for a failure message."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path

from django.conf import settings

from engine.checkpoint.layout import find_latest_good
from engine.contract import checkpoint_dir
from jobs.models import Job
from ringside.services import child_env

STDERR_TAIL_LINES = 40
PR_SET_PDEATHSIG = 1


def run_dir(job: Job) -> Path:
    return settings.RUNS_DIR / str(job.pk)


def checkpoint_folder(job: Job) -> Path:
    """Where the engine keeps the job's disk checkpoints."""
    return checkpoint_dir(job.spec.get("checkpoint", {}).get("dir", ""), run_dir(job))


def resume_point(job: Job) -> Path | None:
    """What the next launch continues from: the job's own newest good checkpoint, else the
    checkpoint it was cloned from, else nothing (a fresh start)."""
    newest, _ = find_latest_good(checkpoint_folder(job))
    if newest is not None:
        return checkpoint_folder(job)
    return Path(job.resume_from) if job.resume_from else None


def engine_command(job: Job, spec_path: Path) -> list[str]:
    folder = spec_path.parent
    command = [
        sys.executable, "-m", "engine.train", str(spec_path),
        "--bus", settings.REDIS_URL, "--job", str(job.pk),
        "--events", str(folder / "events.jsonl"), "--run-dir", str(folder),
    ]
    resume = resume_point(job)
    return command + ["--resume", str(resume)] if resume is not None else command


def start_engine(job: Job) -> subprocess.Popen:
    """Write the job's spec into its run folder and start the engine on it."""
    folder = run_dir(job)
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(job.spec, indent=2), encoding="utf-8")
    with (folder / "stdout.log").open("ab") as out, stderr_path(job).open("wb") as err:
        # its own process group, so cancel signals reach the launcher and every rank
        return subprocess.Popen(engine_command(job, spec_path), cwd=settings.REPO_ROOT,
                                env=child_env(), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    """In the engine's launcher, before exec: SIGTERM it when its supervisor dies, so a lost
    worker leaves no ranks training (the launcher stops its ranks on SIGTERM)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def kill_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stderr_path(job: Job) -> Path:
    return run_dir(job) / "stderr.log"


def stderr_tail(job: Job) -> str:
    with stderr_path(job).open(encoding="utf-8", errors="replace") as f:
        return "".join(deque(f, maxlen=STDERR_TAIL_LINES)).strip()
