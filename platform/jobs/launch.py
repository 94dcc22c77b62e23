"""The engine's processes for one launch of a job on one host: its run folder, its command line
(resuming from the newest good checkpoint after the first launch; on several hosts, the
rendezvous every host's launcher joins), starting it in a process group of its own on the slots
the job holds there, signalling that group, and the tail of its stderr for a failure message.

A job on several hosts runs one engine launcher per host (node rank 0, the lead, holds the
rendezvous endpoint and supervises); each writes its own spec and logs into the run folder,
suffixed with its node rank past the lead, so hosts sharing one filesystem do not collide."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from common.services import engine_env
from engine.runtime import spec as spec_rules
from engine.runtime.spec import find_latest_good
from jobs.confinement import engine_roots, uploads_dir
from jobs.models import Job

STDERR_TAIL_LINES = 40
PR_SET_PDEATHSIG = 1


def run_dir(job: Job) -> Path:
    return settings.RUNS_DIR / str(job.pk)


def checkpoint_folder(job: Job) -> Path | str:
    """Where the engine keeps the job's disk checkpoints: the storage the platform assigns,
    never a folder the spec names (an `s3://` URL under RINGSIDE_STORAGE_URL stays a str)."""
    if settings.STORAGE_URL:
        return f"{settings.STORAGE_URL}/{job.pk}/checkpoints"
    return run_dir(job) / "checkpoints"


def engine_spec(job: Job, spec: dict) -> dict:
    """`spec` as the engine runs it: writing its checkpoints where the platform assigns, and
    reading only under its owner's data roots (engine.runtime.confine)."""
    return {**spec, "checkpoint": {**spec.get("checkpoint", {}),
                                   "dir": str(checkpoint_folder(job))},
            "data": {"roots": engine_roots(job)}}


def resume_point(job: Job) -> Path | str | None:
    """What the next launch continues from: the job's own newest good checkpoint, else the
    checkpoint it was cloned from, else nothing (a fresh start)."""
    newest, _ = find_latest_good(checkpoint_folder(job))
    if newest is not None:
        return checkpoint_folder(job)
    return job.resume_from or None


@dataclass(frozen=True)
class HostShare:
    """This host's part of one incarnation of the job: its node rank among the placed hosts
    (0: the lead), how many hosts there are, the rendezvous every launcher joins, and the slot
    indices the job holds here."""

    node_rank: int = 0
    nnodes: int = 1
    endpoint: str = ""  # HOST:PORT on the lead; empty: one host, the engine picks a port
    run_id: str = ""
    address: str = ""  # where the other hosts reach this one (the host's registered address)
    slots: tuple[int, ...] = ()
    gpus: bool = False

    def suffix(self, name: str) -> str:
        """`name` for this host's own file in a run folder the hosts may share."""
        if self.node_rank == 0:
            return name
        stem, dot, ext = name.partition(".")
        return f"{stem}-node{self.node_rank}{dot}{ext}"


def engine_command(job: Job, spec_path: Path, share: HostShare = HostShare(),
                   bus_url: str = "") -> list[str]:
    """The launcher's command line; `bus_url`: the Redis as the engine's host reaches it
    (default: the platform's own)."""
    folder = spec_path.parent
    command = [
        sys.executable, "-m", "engine.train", str(spec_path),
        "--bus", bus_url or settings.REDIS_URL, "--job", str(job.pk),
        "--events", str(folder / "events.jsonl"), "--run-dir", str(folder),
    ]
    if share.nnodes > 1:
        command += ["--nnodes", str(share.nnodes), "--rdzv-endpoint", share.endpoint,
                    "--rdzv-id", share.run_id, "--local-addr", share.address,
                    "--node-rank", str(share.node_rank)]
    resume = resume_point(job)
    return command + ["--resume", str(resume)] if resume is not None else command


class EngineProcess(subprocess.Popen):
    """This host's engine launcher, the leader of its own process group."""

    @property
    def ref(self) -> str:
        return f"pid {self.pid}"

    def signal_all(self, sig: signal.Signals) -> None:
        """`sig` to the launcher and every rank."""
        kill_group(self, sig)


def write_spec(job: Job, spec: dict, share: HostShare = HostShare()) -> Path:
    """Write the spec this incarnation runs (`spec`: the job's, laid out on the hosts it
    holds) into the run folder; its path."""
    folder = run_dir(job)
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / share.suffix("spec.json")
    spec_path.write_text(json.dumps(engine_spec(job, spec), indent=2), encoding="utf-8")
    return spec_path


def start_engine(job: Job, spec: dict, share: HostShare = HostShare()) -> EngineProcess:
    """Write the spec this incarnation runs and start this host's engine launcher on it."""
    spec_path = write_spec(job, spec, share)
    folder = spec_path.parent
    env = engine_env()  # several hosts: the launcher binds gloo at --local-addr's interface
    if share.gpus and share.slots:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, share.slots))
    with (folder / share.suffix("stdout.log")).open("ab") as out, \
            stderr_path(job, share).open("wb") as err:
        # its own process group, so cancel signals reach the launcher and every rank
        return EngineProcess(engine_command(job, spec_path, share), cwd=settings.REPO_ROOT,
                             env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             start_new_session=True, preexec_fn=_before_exec(share))


def _before_exec(share: HostShare) -> Callable[[], None]:
    """What the engine's launcher does before exec: SIGTERM it when its supervisor dies, so a
    lost worker leaves no ranks training (the launcher stops its ranks on SIGTERM); and on a
    CPU host keep its ranks on the cores of the slots the job holds (slot i: core i modulo the
    core count), so concurrent jobs on one host do not share cores they need not share."""
    cores = {slot % (os.cpu_count() or 1) for slot in share.slots} if not share.gpus else set()

    def prepare() -> None:
        die_with_parent()
        if sys.platform == "linux" and cores:
            os.sched_setaffinity(0, cores)
    return prepare


def die_with_parent() -> None:
    """In a child before exec: SIGTERM it when the process that started it dies (Linux), so
    a lost worker leaves nothing of its work running unobserved."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def kill_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stderr_path(job: Job, share: HostShare = HostShare()) -> Path:
    return run_dir(job) / share.suffix("stderr.log")


def stderr_tail(job: Job) -> str:
    """The end of the engine's stderr, as the job's error shows it to its owner."""
    with stderr_path(job).open(encoding="utf-8", errors="replace") as f:
        return scrub_paths("".join(deque(f, maxlen=STDERR_TAIL_LINES)).strip(), job)


def scrub_paths(text: str, job: Job) -> str:
    """`text` with every absolute path outside the job's own run folder and its owner's
    uploads replaced by a placeholder (engine.runtime.spec.scrub_paths)."""
    return spec_rules.scrub_paths(text, [str(run_dir(job)), str(uploads_dir(job.owner))])
