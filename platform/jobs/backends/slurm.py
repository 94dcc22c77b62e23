"""The `slurm` backend: the cluster's own scheduler places the job and starts its launchers.

Placement is Slurm's: the scheduling pass (`place_waiting`) only counts a new incarnation and
sends the job's supervisor task to the queue that workers with Slurm's clients consume
(settings.SLURM_QUEUE: `manage.py worker` with RINGSIDE_SLURM_SUBMIT=1, on a login node). That
supervisor renders a batch script from the spec (`batch_script`: one node per host, one
launcher per node through `srun`, the CPUs or `--gres` of its ranks, the time limit,
`--signal=B:USR1@<lead>` so the engine checkpoints before the time limit, `--requeue`), submits
it with `sbatch --parsable` and follows it (`SlurmRun`: `squeue`, then `scontrol show job`,
then `sacct`) into the job's states: while Slurm holds it pending, its reason is the job's
waiting reason. The launchers meet through the allocation (`engine.train --rendezvous slurm`)
and publish to the same Redis bus as on Ringside's hosts (RINGSIDE_SLURM_BUS_URL: that Redis
as the nodes reach it), so steering works unchanged: a pause or a cancel reaches the engine,
which checkpoints and exits, ending the Slurm job; a resume is a new submission from the
checkpoint. A stop the engine cannot hear (it is still pending, or stuck) is `scancel`.
"""

from __future__ import annotations

import logging
import shlex
import signal
import subprocess
import sys
import time

from celery import current_app
from django.conf import settings
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import OperationalError

from common.services import engine_env
from jobs.backends.base import LaunchRefused
from jobs.dispatch import RUN_JOB
from jobs.launch import checkpoint_folder, engine_command, resume_point, run_dir, write_spec
from jobs.models import Job, State

log = logging.getLogger(__name__)

CLIENT_TIMEOUT_S = 30
# Slurm's states in which the job may still run (a requeued job is pending again)
ALIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED",
                   "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "SIGNALING",
                   "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED"})


class SlurmError(LaunchRefused):
    """A Slurm client refused or failed; its message says what Slurm said."""


def client(*args: str) -> str:
    """Run a Slurm client (sbatch, squeue, ...) and return its output; SlurmError if it fails."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, env=engine_env(),
                              timeout=CLIENT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SlurmError(f"{args[0]}: {error}") from error
    if done.returncode:
        raise SlurmError(f"{args[0]}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


def place_waiting() -> list[Job]:
    """The scheduling pass for Slurm jobs: each queued, dispatched one gets a new incarnation
    and its supervisor task is sent (Slurm places it when the supervisor submits)."""
    sent = []
    for job in Job.objects.filter(backend="slurm", state=State.QUEUED,
                                  cancel_requested_at__isnull=True,
                                  undispatched_since__isnull=False):
        # claimed by one pass only (two passes at once would submit it twice)
        if not Job.objects.filter(pk=job.pk, undispatched_since=job.undispatched_since).update(
                incarnation=F("incarnation") + 1, undispatched_since=None):
            continue
        job.refresh_from_db()
        try:
            current_app.send_task(RUN_JOB, args=[job.pk, job.incarnation],
                                  queue=settings.SLURM_QUEUE)
        except OperationalError as e:
            log.warning("job %s: run_job could not be queued (%s); sent again at the next "
                        "pass", job.pk, e)
            Job.objects.filter(pk=job.pk).update(undispatched_since=timezone.now())
            continue
        sent.append(job)
    return sent


def batch_script(job: Job, spec: dict, command: list[str], warning: list[str]) -> str:
    """The batch script of one submission: `#SBATCH` lines from the spec and the job's Slurm
    options (each checked by jobs.backends.options: no newline or shell syntax), then `srun`
    starting `command` (the engine's launcher) once per node, and `warning` run when Slurm
    warns of the time limit; a requeued run resumes from the job's own checkpoints."""
    parallel, options = spec["parallel"], job.backend_options.get("slurm", {})
    hosts = int(parallel.get("hosts", 1))
    ranks = int(parallel["nodes"]) // hosts * int(parallel.get("procs_per_node", 1))
    folder = run_dir(job)
    lines = [f"--job-name=ringside-{job.pk}", f"--nodes={hosts}", "--ntasks-per-node=1",
             f"--signal=B:USR1@{settings.SLURM_SIGNAL_LEAD_S}", "--requeue",
             f"--output={folder / 'stdout.log'}", f"--error={folder / 'stderr.log'}",
             "--open-mode=append", f"--chdir={settings.REPO_ROOT}"]
    lines.append(f"--gres={options['gres']}" if options.get("gres")
                 else f"--cpus-per-task={ranks}")
    if options.get("time_limit"):
        lines.append(f"--time={options['time_limit']}")
    lines += [f"--{name}={options[name]}" for name in ("partition", "account", "qos",
                                                       "constraint") if options.get(name)]
    checkpoints = shlex.quote(str(checkpoint_folder(job)))
    return "\n".join([
        "#!/bin/bash", *(f"#SBATCH {line}" for line in lines),
        "resume=()",
        # a requeued job (time limit, node failure) goes on from its own newest checkpoint
        f'if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then resume=(--resume {checkpoints}); fi',
        f'srun --kill-on-bad-exit=1 {shlex.join(command)} --rendezvous slurm "${{resume[@]}}" &',
        "step=$!",
        # Slurm's warning before the time limit (only this shell gets it): the ranks pause
        f"trap {shlex.quote(shlex.join(warning))} USR1",
        # a trap interrupts `wait`: wait again until the step itself ended
        'while :; do wait "$step"; code=$?; kill -0 "$step" 2>/dev/null || break; done',
        'exit "$code"', ""])


class SlurmRun:
    """One submitted Slurm job, followed: `poll` asks Slurm at most every SLURM_POLL_S and
    gives the exit code once the job ended (a signal's as its negative); while Slurm holds it
    pending, its reason is the Ringside job's waiting reason."""

    def __init__(self, job: Job, slurm_id: str):
        self.job, self.slurm_id = job, slurm_id
        self.returncode: int | None = None
        self.asked_at = 0.0
        self.state = "PENDING"
        self.reason = ""

    @property
    def ref(self) -> str:
        return f"Slurm job {self.slurm_id}"

    def poll(self) -> int | None:
        if self.returncode is not None or time.monotonic() - self.asked_at < settings.SLURM_POLL_S:
            return self.returncode
        self.asked_at = time.monotonic()
        state, reason, code = look(self.slurm_id)
        self.state = state
        if state in ALIVE:
            self._waiting(reason if state == "PENDING" else "")
            return None
        self._waiting("")
        self.returncode = code
        return code

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(settings.SLURM_POLL_S)
        return self.returncode

    def signal_all(self, sig: signal.Signals) -> None:
        """SIGTERM: to every process of a running job (the launchers stop their ranks);
        SIGKILL, or a job not running yet: cancelled outright."""
        try:
            if sig == signal.SIGTERM and self.state == "RUNNING":
                client("scancel", "--full", "--signal=TERM", self.slurm_id)
            else:
                client("scancel", self.slurm_id)
        except SlurmError as error:  # it ended meanwhile
            log.info("job %s: %s", self.job.pk, error)

    def _waiting(self, reason: str) -> None:
        if reason != self.reason:
            self.reason = reason
            Job.objects.filter(pk=self.job.pk).update(
                waiting_reason=f"Slurm holds it pending: {reason}" if reason else "")


def look(slurm_id: str) -> tuple[str, str, int]:
    """(state, pending reason, exit code) of a Slurm job: from `squeue` while Slurm holds it,
    `scontrol show job` while it remembers it (MinJobAge), else the accounting (`sacct`)."""
    try:
        line = client("squeue", "-h", "-j", slurm_id, "-o", "%T|%r").strip()
    except SlurmError:
        line = ""
    if line:
        state, _, reason = line.partition("|")
        if state in ALIVE:
            return state, reason, 0
    try:
        fields = dict(item.partition("=")[::2] for item in
                      client("scontrol", "-o", "show", "job", slurm_id).split())
        return fields["JobState"], fields.get("Reason", ""), exit_code(fields["ExitCode"])
    except (SlurmError, KeyError):
        state, _, code = client("sacct", "-j", slurm_id, "-n", "-P", "-X", "-o",
                                "State,ExitCode").strip().partition("|")
        return state.split()[0], "", exit_code(code)


def exit_code(text: str) -> int:
    """Slurm's `CODE:SIGNAL` as a process's return code (a signal's as its negative)."""
    code, _, sig = text.partition(":")
    return -int(sig) if sig and int(sig) else int(code)


class SlurmBackend:
    def start(self, job: Job) -> tuple[SlurmRun, None]:
        """Submit this incarnation; its engine's launchers start when Slurm allocates."""
        spec_path = write_spec(job, job.spec)
        bus = settings.SLURM_BUS_URL or settings.REDIS_URL
        command = engine_command(job, spec_path, bus_url=bus)
        warning = [sys.executable, "-m", "engine.runtime.slurm", "--job", str(job.pk),
                   "--bus", bus]
        script = spec_path.parent / "slurm.sh"
        script.write_text(batch_script(job, job.spec, command, warning), encoding="utf-8")
        slurm_id = client("sbatch", "--parsable", str(script)).strip().split(";")[0]
        Job.objects.filter(pk=job.pk).update(backend_ref=slurm_id)
        log.info("job %s: submitted as Slurm job %s (resuming from %s)", job.pk, slurm_id,
                 resume_point(job))
        return SlurmRun(job, slurm_id), None

    def release(self, job: Job) -> None:
        """Nothing is held once the Slurm job ended (the supervisor waited for it)."""


BACKEND = SlurmBackend()
