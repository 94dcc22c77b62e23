"""The `slurm` backend's side facing Slurm: the cluster's own scheduler places the job and
starts its launchers.

Placement is Slurm's: the scheduling pass (`place_waiting`) only counts a new incarnation and
sends the job's supervisor task to the queue that workers with Slurm's clients consume
(settings.SLURM_QUEUE: `manage.py worker` with RINGSIDE_SLURM_SUBMIT=1, on a login node). That
supervisor renders a batch script from the spec (`batch_script`: one node per host, one
launcher per node through `srun`, the CPUs or `--gres` of its ranks, the time limit,
`--signal=B:USR1@<lead>` so the engine checkpoints before the time limit, `--requeue`),
submits it with `sbatch --parsable` (`submit`) and follows it (jobs.backends.slurm_run, through
`look`: `squeue`, then `scontrol show job`, then `sacct`) into the job's states. The
launchers meet through the allocation (`engine.train --rendezvous slurm`) and publish to the
same Redis bus as on Ringside's hosts (RINGSIDE_SLURM_BUS_URL: that Redis as the nodes reach
it), so steering works unchanged: a pause or a cancel reaches the engine, which checkpoints
and exits, ending the Slurm job; a resume is a new submission from the checkpoint. A stop the
engine cannot hear (it is still pending, or stuck) is `scancel`. A reshard onto another number
of nodes cannot happen inside an allocation: the engine gets a cold pause instead
(`resubmits`), and the job is submitted again at the new size from that checkpoint
(jobs.backends.slurm_run, which also answers a lost node).

Every call to Slurm goes through one small interface (`Slurm`, from `slurm()`): its
command-line clients (`Clients`), or its REST API where the operator sets
RINGSIDE_SLURMRESTD_URL (jobs.backends.slurm_rest). The batch script's options are one table
(`sbatch_options`): the script's `#SBATCH` lines, and for slurmrestd, which reads none of
them, the job descriptor sent beside the script. Where Slurm cannot be asked to warn the job
of its time limit (slurmrestd: `warns_of_time_limit` is False), jobs.backends.slurm_run runs
the script's warning (`time_limit_warning`) itself, from the end time Slurm reports.
"""

from __future__ import annotations

import logging
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from celery import current_app
from django.conf import settings
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import OperationalError

from common.services import engine_env
from jobs.backends.slurm_calls import (
    ALIVE,
    CLIENT_TIMEOUT_S,
    SLURM_DEFAULTS,
    Partition,
    Seen,
    Slurm,
    SlurmError,
    down_within_s,
)
from jobs.backends.slurm_rest import SlurmRest
from jobs.dispatch import RUN_JOB
from jobs.launch import checkpoint_folder, engine_command, resume_point, run_dir, write_spec
from jobs.models import Job, State

log = logging.getLogger(__name__)

def client(*args: str) -> str:
    """Run a Slurm client (sbatch, squeue, ...), or the time limit's warning
    (`time_limit_warning`), and return its output; SlurmError if it fails."""
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


def sbatch_options(job: Job, spec: dict) -> dict[str, str | bool]:
    """The options of one submission by sbatch's long names (True: a flag without a value),
    from the spec and the job's Slurm options (each checked by jobs.backends.options: no
    newline or shell syntax)."""
    parallel, options = spec["parallel"], job.backend_options.get("slurm", {})
    hosts = int(parallel.get("hosts", 1))
    ranks = int(parallel["nodes"]) // hosts * int(parallel.get("procs_per_node", 1))
    folder = run_dir(job)
    chosen: dict[str, str | bool] = {
        "job-name": f"ringside-{job.pk}", "nodes": str(hosts), "ntasks-per-node": "1",
        "signal": f"B:USR1@{settings.SLURM_SIGNAL_LEAD_S}", "requeue": True,
        "output": str(folder / "stdout.log"), "error": str(folder / "stderr.log"),
        "open-mode": "append", "chdir": str(settings.REPO_ROOT)}
    if options.get("gres"):
        chosen["gres"] = options["gres"]
    else:
        chosen["cpus-per-task"] = str(ranks)
    if options.get("time_limit"):
        chosen["time"] = str(options["time_limit"])
    chosen.update({name: options[name] for name in ("partition", "account", "qos", "constraint")
                   if options.get(name)})
    if job.backend_options.get("exclude"):  # nodes it lost (jobs.backends.slurm_run)
        chosen["exclude"] = ",".join(job.backend_options["exclude"])
    return chosen


def batch_script(job: Job, spec: dict, command: list[str], warning: list[str]) -> str:
    """The batch script of one submission: its options as `#SBATCH` lines (`sbatch_options`),
    then `srun` starting `command` (the engine's launcher) once per node, and `warning` run
    when Slurm warns of the time limit; a requeued run resumes from the job's own checkpoints."""
    lines = [f"--{name}" if value is True else f"--{name}={value}"
             for name, value in sbatch_options(job, spec).items()]
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
        # a trap interrupts `wait` (its status is then the signal's): wait again while the
        # step runs, then once more for its own exit status
        'while kill -0 "$step" 2>/dev/null; do wait "$step"; done',
        'wait "$step"', ""])


class Clients:
    """Slurm through its command-line clients."""

    warns_of_time_limit = True  # sbatch takes the script's `--signal=B:USR1@<lead>`

    def submit(self, script: Path, options: dict[str, str | bool]) -> str:
        """`sbatch --parsable`: the script's `#SBATCH` lines carry the options."""
        return client("sbatch", "--parsable", str(script)).strip().split(";")[0]

    def look(self, slurm_id: str) -> Seen:
        """From `squeue` while Slurm holds the job, `scontrol show job` while it remembers it
        (MinJobAge), else the accounting (`sacct`)."""
        try:
            line = client("squeue", "-h", "-j", slurm_id, "-o", "%T|%r|%N").strip()
        except SlurmError:
            line = ""
        if line:
            state, reason, nodes = (line.split("|") + ["", ""])[:3]
            if state in ALIVE:
                return Seen(state, reason, 0, nodes)
        try:
            fields = dict(item.partition("=")[::2] for item in
                          client("scontrol", "-o", "show", "job", slurm_id).split())
            return Seen(fields["JobState"], fields.get("Reason", ""),
                        exit_code(fields["ExitCode"]))
        except (SlurmError, KeyError):
            state, _, code = client("sacct", "-j", slurm_id, "-n", "-P", "-X", "-o",
                                    "State,ExitCode").strip().partition("|")
            return Seen(state.split()[0], "", exit_code(code))

    def hostnames(self, nodes: str) -> list[str]:
        return client("scontrol", "show", "hostnames", nodes).split() if nodes else []

    def cancel(self, slurm_id: str, sig: signal.Signals | None = None) -> None:
        if sig is None:
            client("scancel", slurm_id)
        else:
            client("scancel", "--full", f"--signal={sig.name.removeprefix('SIG')}", slurm_id)

    def lost_nodes(self, nodes: list[str]) -> list[str]:
        """Down, failed, drained or draining in `sinfo`, or not responding (`*`)."""
        if not nodes:
            return []
        out = client("sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t")
        return sorted({name for name, state in (line.split() for line in out.splitlines())
                       if "*" in state or state.startswith(("down", "drain", "drng", "fail"))})

    def node_down_within_s(self) -> float:
        """From the cluster's configuration (`scontrol show config`)."""
        config = dict(SLURM_DEFAULTS)
        for line in client("scontrol", "show", "config").splitlines():
            name, _, value = line.partition("=")
            if name.strip() in config and value.split():
                config[name.strip()] = value.split()[0]
        return down_within_s(config)

    def partitions(self) -> list[Partition]:
        """From `scontrol -a show partition` (hidden ones too)."""
        found = []
        for line in client("scontrol", "-a", "-o", "show", "partition").splitlines():
            fields = dict(item.partition("=")[::2] for item in line.split())
            if "PartitionName" in fields:
                nodes = fields.get("MaxNodes", "UNLIMITED")
                found.append(Partition(fields["PartitionName"], fields.get("Default") == "YES",
                                       int(nodes) if nodes.isdigit() else None,
                                       minutes(fields.get("MaxTime", "UNLIMITED"))))
        return found


CLIENTS = Clients()


def exit_code(text: str) -> int:
    """Slurm's `CODE:SIGNAL` as a process's return code (a signal's as its negative)."""
    code, _, sig = text.partition(":")
    return -int(sig) if sig and int(sig) else int(code)


def minutes(text: str) -> int | None:
    """Slurm's `[D-]HH:MM:SS` (or `MM`) as whole minutes; None for UNLIMITED."""
    if not text[:1].isdigit():
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        return int(days or 0) * 1440 + parts[0]
    hours, mins = (parts + [0])[:2] if len(parts) == 3 else (0, parts[0])
    return int(days or 0) * 1440 + hours * 60 + mins


def slurm() -> Slurm:
    """How the platform talks to Slurm: through its REST API where RINGSIDE_SLURMRESTD_URL is
    set (jobs.backends.slurm_rest), else through its clients."""
    if settings.SLURMRESTD_URL:
        return SlurmRest.from_settings()
    return CLIENTS


def submit(job: Job) -> str:
    """Render the batch script of `job` as its spec says now and submit it; the Slurm job's
    id, also kept as the job's `backend_ref`."""
    spec_path = write_spec(job, job.spec)
    bus = settings.SLURM_BUS_URL or settings.REDIS_URL
    command = engine_command(job, spec_path, bus_url=bus)
    script = spec_path.parent / "slurm.sh"
    script.write_text(batch_script(job, job.spec, command, time_limit_warning(job, bus)),
                      encoding="utf-8")
    slurm_id = slurm().submit(script, sbatch_options(job, job.spec))
    Job.objects.filter(pk=job.pk).update(backend_ref=slurm_id)
    log.info("job %s: submitted as Slurm job %s on %s node(s) (resuming from %s)", job.pk,
             slurm_id, job.spec["parallel"].get("hosts", 1), resume_point(job))
    return slurm_id


def time_limit_warning(job: Job, bus_url: str = "") -> list[str]:
    """The command that warns `job` of its time limit (engine.runtime.slurm: a cold pause on
    its control channel), run by the batch script when Slurm warns it, else by the platform
    (jobs.backends.slurm_run); `bus_url`: the Redis as the command's machine reaches it
    (default: the platform's own)."""
    return [sys.executable, "-m", "engine.runtime.slurm", "--job", str(job.pk),
            "--bus", bus_url or settings.REDIS_URL]


def resubmits(job: Job, args: dict[str, Any]) -> bool:
    """Whether a reshard with `args` needs another Slurm allocation (another node count): the
    engine then gets a cold pause, and the job is submitted again at the new size."""
    return job.backend == "slurm" and args.get("hosts") not in (
        None, job.spec.get("parallel", {}).get("hosts", 1))
