"""`run_job`, the supervisor of one training job, and `reap`, which finds lost supervisors.

`run_job` launches the engine (`python -m engine.train`) in its own process group, drives the
job's ingest (bus → database → websockets), follows the engine's `state` events to move the
job, settles commands when the engine's `action` events name them, applies the platform's
fault policy (jobs.policy), carries out cancel requests (the cancel command, then SIGTERM to
the process group, SIGKILL after a grace period) and records how the engine ended. A paused
engine exits, so pausing frees the worker; resuming queues `run_job` again, and every launch
after the first continues from the newest good checkpoint.

Worker loss: the task is acknowledged late and handed back if its worker process dies; the
engine gets SIGTERM when its supervisor dies (Linux parent-death signal), so no rank trains
unobserved. While it owns the job the supervisor beats `Job.heartbeat_at`; `reap` (Celery
beat, every JOB_REAPER_INTERVAL_S) requeues a supervised job whose beat is older than
JOB_HEARTBEAT_TIMEOUT_S, and the new supervisor resumes it from its newest checkpoint.

Broker loss: a job is queued through `dispatch`, which marks it undispatched until its
`run_job` message reached the broker; `reap` sends the message again for a job queued while
the broker was down (a duplicate message is harmless: the second `run_job` finds the job no
longer queued).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis
from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from engine.checkpoint import find_latest_good
from engine.runtime.events import BUS_RETRY_S, BusOutage
from jobs.models import (
    SUPERVISED,
    Cause,
    Command,
    CommandKind,
    IllegalTransition,
    Job,
    JobEvent,
    State,
)
from jobs.policy import AUTO_ACTION_WINDOW_S, PASSIVE_ACTIONS
from jobs.steering import deliver_pending, issue, policy_of
from jobs.webhooks import notify
from monitor.ingest import StreamIngest, forward
from monitor.models import Action
from ringside.services import child_env

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.5
# a command still pending this long after it was issued missed its delivery (the bus was
# away): the supervisor delivers it, looking at each heartbeat
REDELIVER_AFTER_S = 5.0
STDERR_TAIL_LINES = 40
EXIT_PAUSED = 3  # engine.runtime.launch: a checkpoint was written, `--resume` continues
POLICY_ACTOR = "platform policy"
PR_SET_PDEATHSIG = 1


def run_dir(job: Job) -> Path:
    return settings.RUNS_DIR / str(job.pk)


def checkpoint_folder(job: Job) -> Path:
    """Where the engine keeps the job's disk checkpoints (engine.runtime.launch's rule)."""
    configured = job.spec.get("checkpoint", {}).get("dir")
    return Path(configured) if configured else run_dir(job) / "checkpoints"


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


def _stderr_tail(path: Path) -> str:
    with path.open(encoding="utf-8", errors="replace") as f:
        return "".join(deque(f, maxlen=STDERR_TAIL_LINES)).strip()


def _notify_state(job: Job, seq: int) -> None:
    forward(job.pk, [{"type": "job", "seq": seq, "state": job.state, "step": job.step,
                      "error": job.error}])


def _die_with_parent() -> None:
    """In the engine's launcher, before exec: SIGTERM it when its supervisor dies, so a lost
    worker leaves no ranks training (the launcher stops its ranks on SIGTERM)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _take_over(job: Job) -> bool:
    """A redelivered task (its worker died) finds the job still supervised: take it over if
    the old supervisor stopped beating, else leave it to the one that still beats."""
    if not Job.stale(settings.JOB_HEARTBEAT_TIMEOUT_S).filter(pk=job.pk).exists():
        return False
    try:
        job.requeue(Cause.WORKER_LOSS, f"its supervisor ({job.supervisor or 'unknown'}) was "
                    f"lost while the job was {job.state}; resuming from the newest checkpoint")
    except IllegalTransition:
        return False
    return True


def dispatch(job: Job) -> None:
    """Queue `run_job` for the queued `job` once the current transaction commits. Call it
    inside that transaction: the job is marked undispatched with it, so a message that cannot
    be sent (the broker is down) is sent again by `reap` rather than lost."""
    Job.objects.filter(pk=job.pk).update(undispatched_since=timezone.now())
    transaction.on_commit(lambda pk=job.pk: _send_run_job(pk))


def _send_run_job(job_id: int) -> None:
    try:
        run_job.delay(job_id)
    except OperationalError as e:
        log.warning("job %s: run_job could not be queued (%s); the reaper sends it again",
                    job_id, e)
        return
    Job.objects.filter(pk=job_id).update(undispatched_since=None)


@shared_task(bind=True, name="jobs.tasks.run_job")
def run_job(self, job_id: int) -> str:
    """Supervise job `job_id` from launch to its final state (or its pause); returns the state."""
    job = Job.objects.get(pk=job_id)
    if job.state in SUPERVISED and not _take_over(job):
        return job.state
    job.refresh_from_db()
    if job.state != State.QUEUED:
        return job.state  # cancelled while it waited in the queue
    me = f"{socket.gethostname()}/{os.getpid()}/{self.request.id or 'direct'}"
    try:
        job.start(supervisor=me)
    except IllegalTransition:
        return job.state  # another supervisor took it first
    folder = run_dir(job)
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(job.spec, indent=2), encoding="utf-8")
    client = redis.Redis.from_url(settings.REDIS_URL)
    ingest = StreamIngest(job.pk, client, consumer=f"supervisor-{job.pk}")
    # what an earlier incarnation published and nobody stored is stored now, before this
    # launch's events, so it cannot be mistaken for them
    ingest.drain()
    _notify_state(job, ingest.last_seq)

    stderr_path = folder / "stderr.log"
    with (folder / "stdout.log").open("ab") as out, stderr_path.open("wb") as err:
        # its own process group, so cancel signals reach the launcher and every rank
        proc = subprocess.Popen(engine_command(job, spec_path), cwd=settings.REPO_ROOT,
                                env=child_env(), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with_parent)
    log.info("job %s: engine started, pid %s (launch %s)", job.pk, proc.pid, job.launches)
    try:
        engine = Supervisor(job, proc, ingest, me).run()
    except BaseException:
        # the supervisor can no longer follow the run (database or Redis gone, or the task is
        # being torn down): stop the engine rather than leave ranks training unobserved; the
        # job stays as it is for the reaper to requeue once its heartbeat is stale
        _kill_group(proc, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        client.close()
    if engine.owned:
        _finish(job, proc.returncode, engine, stderr_path)
        _notify_state(job, ingest.last_seq)
    return job.state


@dataclass
class EngineReport:
    """What the engine's last `state` event said, and whether the job is still ours."""

    state: str = ""
    error: str = ""
    reason: str = ""
    owned: bool = True


class Supervisor:
    """The loop of one launch: pump events until the engine exits."""

    def __init__(self, job: Job, proc: subprocess.Popen, ingest: StreamIngest, me: str):
        self.job, self.proc, self.ingest, self.me = job, proc, ingest, me
        self.engine = EngineReport()
        self.policy = policy_of(job)
        self.term_at: float | None = None
        self.kill_at: float | None = None
        self.sigterm_sent = False
        self.started_at = timezone.now()

    def run(self) -> EngineReport:
        last_check = last_beat = 0.0
        bus = BusOutage(str(self.job.pk), "the engine trains on; its events wait for the bus")
        while True:
            exited = self.proc.poll() is not None
            try:
                events = (self.ingest.drain() if exited
                          else self.ingest.poll(block_ms=int(CANCEL_POLL_S * 1000)))
            except (redis.ConnectionError, redis.TimeoutError) as error:
                # Redis went away (or restarts): keep beating and watching the engine, which
                # keeps its events until the bus is back; an engine that exited meanwhile is
                # reported once its last events have been stored, or, if the bus stays away,
                # left to the reaper
                bus.failed(error)
                if exited and time.monotonic() - bus.since > settings.JOB_HEARTBEAT_TIMEOUT_S:
                    raise
                events, exited = [], False
                time.sleep(BUS_RETRY_S)
            else:
                bus.succeeded()
            for event in events:
                self.on_event(event)
            if exited:
                return self.engine
            now = time.monotonic()
            if now - last_beat >= settings.JOB_HEARTBEAT_S:
                last_beat = now
                if not self.job.beat(self.me):
                    # the reaper gave the job to another supervisor: this launch is not ours
                    log.warning("job %s: no longer supervised by %s; stopping its engine",
                                self.job.pk, self.me)
                    _kill_group(self.proc, signal.SIGKILL)
                    self.proc.wait()
                    self.engine.owned = False
                    return self.engine
                if not bus.down:
                    deliver_pending(self.job, since=self.started_at, older_than=timezone.now()
                                    - timedelta(seconds=REDELIVER_AFTER_S))
            if now - last_check >= CANCEL_POLL_S:
                last_check = now
                self.check_cancel(now)
            if self.term_at is not None and now >= self.term_at and not self.sigterm_sent:
                log.info("job %s: cancel requested, SIGTERM to the engine", self.job.pk)
                _kill_group(self.proc, signal.SIGTERM)
                self.sigterm_sent, self.kill_at = True, now + settings.JOB_CANCEL_GRACE_S
            if self.kill_at is not None and now >= self.kill_at:
                log.warning("job %s: engine still alive after SIGTERM, SIGKILL", self.job.pk)
                _kill_group(self.proc, signal.SIGKILL)
                self.kill_at = None

    def check_cancel(self, now: float) -> None:
        job = self.job
        job.refresh_from_db(fields=["cancel_requested_at", "cancel_cause", "cancel_actor",
                                    "state"])
        if job.cancel_requested_at and self.term_at is None:
            # a running engine got the cancel command and stops at its next step boundary;
            # one still starting reads no commands yet and is stopped by a signal
            delivered = Command.objects.filter(job=job, kind=CommandKind.CANCEL,
                                               state="delivered").exists()
            wait = settings.JOB_CANCEL_COMMAND_WAIT_S if delivered else 0.0
            self.term_at = now + wait

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "state":
            self.on_state(event)
        elif kind == "action":
            self.on_action(event)
        elif kind == "anomaly":
            notify(self.job, "anomaly", {k: event.get(k) for k in
                                         ("kind", "severity", "rank", "step", "evidence")})

    def on_state(self, event: dict[str, Any]) -> None:
        job, state = self.job, event.get("state", "")
        self.engine = EngineReport(state, event.get("error", self.engine.error),
                                   event.get("reason", ""))
        job.refresh_from_db(fields=["state"])
        moved = True
        if state == "running" and job.state == State.STARTING:
            job.mark_running()
        elif state == "running" and job.state == State.RESHARDING:
            job.back_to_running("the engine resumed on its new layout")
        elif state == "resharding":
            job.adopt_layout(event.get("parallel") or {}, int(event.get("micro_batch", 0)))
            moved = False
        elif state == "completed" and job.state in (State.STARTING, State.RUNNING,
                                                    State.ROLLING_BACK, State.RESHARDING,
                                                    State.PAUSING):
            job.begin_completing()
        else:
            moved = False
        if moved:
            _notify_state(job, event["seq"])

    def on_action(self, event: dict[str, Any]) -> None:
        job = self.job
        command_id = str(event.get("command") or "")
        if command_id.isdigit():
            self.settle(int(command_id), event)
        elif event.get("by") == "policy" and event.get("action") not in PASSIVE_ACTIONS:
            recent = Action.objects.filter(
                job=job, by="policy", time__gte=time.time() - AUTO_ACTION_WINDOW_S,
            ).exclude(action__in=PASSIVE_ACTIONS).count()
            job.refresh_from_db(fields=["state"])
            if self.policy.wants_pause(recent) and job.state == State.RUNNING:
                reason = (f"the engine's fault policy acted {recent} times within an hour "
                          f"(limit {self.policy.max_auto_actions_per_hour}): paused for a person")
                try:
                    issue(job, CommandKind.PAUSE, {"reason": reason}, actor=POLICY_ACTOR,
                          cause=Cause.POLICY, engine_args={})
                except IllegalTransition:
                    return
                notify(job, "policy.pause", {"reason": reason, "auto_actions": recent})

    def settle(self, command_id: int, event: dict[str, Any]) -> None:
        job = self.job
        command = Command.objects.filter(job=job, pk=command_id).first()
        if command is None:
            return
        refused = event.get("action") == "refused"
        result = {k: v for k, v in event.items() if k not in ("type", "job", "time")}
        if not command.settle(not refused, result):
            return
        job.refresh_from_db(fields=["state"])
        steering = {CommandKind.PAUSE: State.PAUSING, CommandKind.ROLLBACK: State.ROLLING_BACK,
                    CommandKind.RESHARD: State.RESHARDING}
        if refused and job.state == steering.get(command.kind):
            job.back_to_running(f"{command.kind} refused by the engine: {event.get('error')}")
            _notify_state(job, event["seq"])
        elif command.kind == CommandKind.ROLLBACK and job.state == State.ROLLING_BACK:
            job.back_to_running(f"rolled back from step {event.get('from_step')} to step "
                                f"{event.get('to_step')} ({event.get('checkpoint')})")
            _notify_state(job, event["seq"])


def _kill_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _finish(job: Job, returncode: int, engine: EngineReport, stderr_path: Path) -> None:
    job.refresh_from_db()
    try:
        if job.cancel_requested_at:
            job.finish_cancel(f"engine stopped on request (exit code {returncode})")
        elif returncode == 0:
            if job.state != State.COMPLETING:
                job.begin_completing()
            job.complete()
        elif returncode == EXIT_PAUSED:
            if job.state == State.RUNNING:  # the engine's own policy paused it for a person
                job.request_pause(Cause.POLICY, "engine fault policy")
            job.mark_paused("the engine checkpointed and stopped; resume continues from there")
        else:
            _failed(job, returncode, engine, stderr_path)
    except IllegalTransition:
        log.exception("job %s: could not record the engine's end (exit %s)", job.pk, returncode)
    for command in Command.open_for(job):
        command.settle(False, {"error": f"the run ended ({job.state}) before the engine acted "
                                        "on it"})
    if job.state in (State.PAUSED, State.COMPLETED, State.FAILED, State.CANCELLED):
        notify(job, f"job.{job.state}", {"error": job.error} if job.error else {})


def _failed(job: Job, returncode: int, engine: EngineReport, stderr_path: Path) -> None:
    reason = engine.error or f"the engine exited with code {returncode}"
    if engine.state == "cancelled":  # e.g. the platform shutting down (Ctrl-C)
        reason = (f"the engine was stopped from outside the platform "
                  f"({engine.reason or 'a signal'}; exit code {returncode})")
    if returncode < 0:
        reason = f"the engine was killed by signal {signal.Signals(-returncode).name}"
    resumes = JobEvent.objects.filter(job=job, cause=Cause.POLICY,
                                      to_state=State.QUEUED).count()
    if policy_of(job).wants_resume(resumes) and resume_point(job) is not None:
        with transaction.atomic():
            job.requeue(Cause.POLICY, f"{reason}; the platform policy resumes it from its "
                        f"newest checkpoint (resume {resumes + 1} of "
                        f"{policy_of(job).resume_on_failure})", actor=POLICY_ACTOR)
            dispatch(job)
        notify(job, "policy.resume", {"reason": reason, "resume": resumes + 1})
        return
    tail = _stderr_tail(stderr_path)
    job.fail(f"{reason}\n\n--- engine stderr (tail) ---\n{tail}" if tail else reason)


@shared_task(name="jobs.tasks.reap")
def reap() -> list[int]:
    """Requeue every supervised job whose supervisor stopped beating, and send `run_job` again
    for every job whose message never reached the broker; returns the ids of both."""
    requeued = []
    for job in Job.undispatched(settings.JOB_REAPER_INTERVAL_S):
        log.warning("job %s: queued at %s but its run_job message was not sent; sending it",
                    job.pk, job.undispatched_since.isoformat())
        _send_run_job(job.pk)
        requeued.append(job.pk)
    for job in Job.stale(settings.JOB_HEARTBEAT_TIMEOUT_S):
        beat = job.heartbeat_at.isoformat() if job.heartbeat_at else "never"
        with transaction.atomic():
            try:
                job.requeue(Cause.WORKER_LOSS, f"its supervisor ({job.supervisor or 'unknown'}) "
                            f"stopped beating (last beat {beat}, now "
                            f"{timezone.now().isoformat()}); resuming from the newest checkpoint")
            except IllegalTransition:
                continue  # it moved on meanwhile
            dispatch(job)
        requeued.append(job.pk)
        log.warning("job %s: supervisor lost, requeued", job.pk)
    return requeued
