"""One launch of a job's engine, followed from start to exit.

`supervise` starts the engine through the job's backend (jobs.backends) and runs the
`Supervisor` loop: it pumps the job's ingest (bus → database → websockets), moves the job as
the engine's `state` events report, settles commands when `action` events name them
(jobs.commands), hands the engine's policy actions and the run's failure to the platform's
fault policy (jobs.policy), carries out cancel requests (the cancel command, then SIGTERM to
the launch, SIGKILL after a grace period), beats the job's heartbeat and redelivers commands
the bus missed. A time-limit pause under Slurm (engine.runtime.slurm) goes on at once, in a
new submission from the checkpoint it wrote. When the engine exits,
`finish` records how it ended and releases the job's slots. A paused engine exits, so pausing
frees the worker and the slots.

On several hosts the supervisor is the lead's part: it picks the rendezvous endpoint, starts
the other hosts' parts, beats its own reservation and watches theirs (jobs.membership). When
a placed host is drained, or the job runs on fewer hosts than it asked for and
`parallel.scale_up` finds room for more, it regroups at the engine's next checkpoint: a pause,
then placement anew.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from datetime import timedelta

import redis
from django.conf import settings
from django.utils import timezone

from engine import contract
from engine.contract import TIME_LIMIT_COMMAND, ExitCode, JobState, PauseMode
from engine.runtime.events import BUS_RETRY_S, BusOutage
from jobs import backends, commands, evaluations, policy, proposals
from jobs.backends import Launched
from jobs.dispatch import send_schedule
from jobs.launch import scrub_paths, stderr_tail
from jobs.membership import Peers, exclude, lose_hosts, regroup, regroup_reason
from jobs.models import Cause, Command, CommandKind, CommandState, IllegalTransition, Job, State
from jobs.telemetry import Ingest, telemetry
from jobs.webhooks import notify

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.5
# a command still pending this long after it was issued missed its delivery (the bus was
# away): the supervisor delivers it, looking at each heartbeat
REDELIVER_AFTER_S = 5.0
# the job states from which the engine's `completed` state event begins completing the job
COMPLETES_FROM = frozenset({State.STARTING, State.RUNNING, State.ROLLING_BACK,
                            State.RESHARDING, State.PAUSING})


def supervise(job: Job, me: str) -> None:
    """Launch the engine for the started `job` and follow it until it exits; `me` names this
    supervisor (its heartbeat's owner)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    monitoring = telemetry()
    ingest = monitoring.ingest(job.pk, client, f"supervisor-{job.pk}")
    # what an earlier incarnation published and nobody stored is stored now, before this
    # launch's events, so it cannot be mistaken for them
    ingest.drain()
    backend = backends.of(job)
    try:
        proc, peers = backend.start(job)
    except backends.LaunchRefused as refused:
        job.fail(scrub_paths(str(refused), job))
        return
    log.info("job %s: engine started, %s (launch %s)", job.pk, proc.ref, job.launches)
    # each sink follows the stream on its own thread, never holding the ingest (monitor.sinks)
    sink_runners = monitoring.start_sinks(job.pk, settings.REDIS_URL)
    supervisor = Supervisor(job, proc, ingest, me, peers)
    try:
        engine = supervisor.run()
    except BaseException:
        # the supervisor can no longer follow the run (database or Redis gone, or the task is
        # being torn down): stop the engine rather than leave ranks training unobserved; the
        # job stays as it is for the reaper to requeue once its heartbeat is stale
        proc.signal_all(signal.SIGKILL)
        proc.wait()
        raise
    finally:
        client.close()
        monitoring.stop_sinks(sink_runners)
    if engine.owned:
        backend.release(job)  # before `finish`, which may queue the job to be placed anew
        finish(job, proc.returncode, engine)
        if supervisor.regroup and job.state == State.PAUSED:
            regroup(job, supervisor.regroup)
    send_schedule()  # the slots it held may fit a waiting job


@dataclass
class EngineReport:
    """What the engine's last `state` event said, and whether the job is still ours."""

    state: str = ""
    error: str = ""
    reason: str = ""
    owned: bool = True


class Supervisor:
    """The loop of one launch: pump events until the engine exits."""

    def __init__(self, job: Job, proc: Launched | None, ingest: Ingest | None,
                 me: str, peers: Peers | None = None):
        self.job, self.proc, self.ingest, self.me, self.peers = job, proc, ingest, me, peers
        self.engine = EngineReport()
        self.regroup = ""  # why the job moves to other hosts at its next checkpoint
        self.last_peer_check = 0.0
        self.term_at: float | None = None
        self.kill_at: float | None = None
        self.sigterm_sent = False
        self.started_at = timezone.now()
        self.last_beat = self.last_check = 0.0

    def run(self) -> EngineReport:
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
            if exited or not self.tick(bus_up=not bus.down):
                return self.engine

    def tick(self, bus_up: bool) -> bool:
        """The periodic work between polls: the heartbeat (False when the job was given to
        another supervisor, whose engine this one stopped), redelivery, cancel signals."""
        now = time.monotonic()
        if now - self.last_beat >= settings.JOB_HEARTBEAT_S:
            self.last_beat = now
            if not self.job.beat(self.me):
                log.warning("job %s: no longer supervised by %s; stopping its engine",
                            self.job.pk, self.me)
                self.proc.signal_all(signal.SIGKILL)
                self.proc.wait()
                self.engine.owned = False
                return False
            if bus_up:
                commands.deliver_pending(self.job, since=self.started_at, older_than=(
                    timezone.now() - timedelta(seconds=REDELIVER_AFTER_S)))
        if now - self.last_check >= CANCEL_POLL_S:
            self.last_check = now
            self.check_cancel(now)
        if self.peers is not None and now - self.last_peer_check >= settings.PART_BEAT_S:
            self.last_peer_check = now
            if not self.check_peers():
                return False
        if self.term_at is not None and now >= self.term_at and not self.sigterm_sent:
            log.info("job %s: cancel requested, SIGTERM to the engine", self.job.pk)
            self.proc.signal_all(signal.SIGTERM)
            self.sigterm_sent, self.kill_at = True, now + settings.JOB_CANCEL_GRACE_S
        if self.kill_at is not None and now >= self.kill_at:
            log.warning("job %s: engine still alive after SIGTERM, SIGKILL", self.job.pk)
            self.proc.signal_all(signal.SIGKILL)
            self.kill_at = None
        return True

    def check_peers(self) -> bool:
        """Beat this host's part and look at the others'; False (engine stopped, the job no
        longer ours) when a host was lost or another part found the incarnation over."""
        peers, job = self.peers, self.job
        lost = peers.silent()
        if peers.beat() and peers.current() and not (lost and lose_hosts(
                job, peers.incarnation, lost, f"host(s) {', '.join(lost)} stopped beating")):
            self.regroup = self.regroup or regroup_reason(job, peers.incarnation)
            return True
        log.warning("job %s: incarnation %s is over; stopping its engine here", job.pk,
                    peers.incarnation)
        self.proc.signal_all(signal.SIGKILL)
        self.proc.wait()
        self.engine.owned = False
        return False

    def check_cancel(self, now: float) -> None:
        job = self.job
        job.refresh_from_db(fields=["cancel_requested_at", "cancel_cause", "cancel_actor",
                                    "state"])
        if job.cancel_requested_at and self.term_at is None:
            # a running engine got the cancel command and stops at its next step boundary;
            # one still starting reads no commands yet and is stopped by a signal
            delivered = Command.objects.filter(job=job, kind=CommandKind.CANCEL,
                                               state=CommandState.DELIVERED).exists()
            wait = settings.JOB_CANCEL_COMMAND_WAIT_S if delivered else 0.0
            self.term_at = now + wait

    def on_event(self, event: contract.Event) -> None:
        """One event the ingest stored (and parsed)."""
        if isinstance(event, contract.StateEvent):
            self.on_state(event)
        elif isinstance(event, contract.ActionEvent):
            if (event.command or "").isdigit():  # a platform command's id
                commands.settle(self.job, event)
            elif event.command == TIME_LIMIT_COMMAND and event.action == "pause":
                # the engine checkpointed before Slurm's time limit: on again from there
                self.regroup = "the Slurm time limit was near"
            elif event.action == "exclude" and self.peers is not None:
                self.exclude(event)
            else:
                policy.auto_pause(self.job, event)
        elif isinstance(event, contract.CheckpointEvent):
            policy.storage_pause(self.job)
            evaluations.on_checkpoint(self.job, event)
            if event.tier == contract.CheckpointTier.DISK and self.job.state == State.RUNNING:
                self.regroup_at_checkpoint()
        elif isinstance(event, contract.ProposalEvent):
            proposals.on_event(self.job, event)
        elif isinstance(event, contract.AnomalyEvent):
            notify(self.job, "anomaly", {"kind": event.kind, "severity": event.severity,
                                         "rank": event.rank, "step": event.step,
                                         "evidence": event.evidence})

    def exclude(self, event: contract.ActionEvent) -> None:
        """The fault policy excludes a persistent straggler: drain its host and move the job
        off it now (from the checkpoint the pause writes)."""
        reason = exclude(self.job, self.peers.incarnation, event.rank or 0)
        self.job.refresh_from_db(fields=["state"])
        if reason and self.job.state == State.RUNNING:
            self.regroup = reason
            self.pause_to_regroup()

    def regroup_at_checkpoint(self) -> None:
        """A disk checkpoint was written: move now if the job should (looked at again here, not
        only at the peers' beat: a host that came back a moment ago must not wait for the
        checkpoint after this one)."""
        if self.peers is not None:
            self.regroup = self.regroup or regroup_reason(self.job, self.peers.incarnation)
        if self.regroup:
            self.pause_to_regroup()

    def pause_to_regroup(self) -> None:
        """Stop at the next step boundary (a cold pause: the checkpoint it writes is where the
        next incarnation, on other hosts, begins)."""
        log.info("job %s: regrouping: %s", self.job.pk, self.regroup)
        try:
            commands.issue(self.job, CommandKind.PAUSE, {}, actor="scheduler",
                           cause=Cause.SCHEDULER)
        except IllegalTransition:
            self.regroup = ""  # it moved on (a person paused it, say): look again later

    def on_state(self, event: contract.StateEvent) -> None:
        """Move the job as the engine reports."""
        job = self.job
        self.engine = EngineReport(event.state, event.error or self.engine.error,
                                   event.reason or "")
        job.refresh_from_db(fields=["state"])
        if event.state == JobState.RUNNING and event.mode != PauseMode.WARM \
                and job.state != State.STARTING:
            # the ranks of this launch began anew: what they were told and did not answer
            # (a pause while the policy restarted them, say) would never be answered
            commands.redeliver(job)
        if event.state == JobState.RUNNING and job.state == State.STARTING:
            job.mark_running()
        elif event.state == JobState.RUNNING and job.state == State.RESHARDING:
            job.back_to_running("the engine resumed on its new layout")
        elif event.mode == PauseMode.WARM and (event.state, job.state) == (JobState.PAUSED,
                                                                            State.PAUSING):
            job.mark_paused_warm("the ranks idle in memory, holding the worker; resume goes on "
                                 "at once (the pause turns cold past its limit)")
        elif event.mode == PauseMode.WARM and (event.state, job.state) == (JobState.RUNNING,
                                                                            State.PAUSED_WARM):
            job.resumed_warm()
        elif event.state == JobState.RESHARDING:
            job.adopt_layout(event.parallel or {}, event.micro_batch or 0)
        elif event.state == JobState.COMPLETED and job.state in COMPLETES_FROM:
            job.begin_completing()


def finish(job: Job, returncode: int, engine: EngineReport) -> None:
    """Record how the engine ended, close the commands it never answered and tell the job's
    webhooks about a final state (or a pause)."""
    job.refresh_from_db()
    try:
        if job.cancel_requested_at:
            job.finish_cancel(f"engine stopped on request (exit code {returncode})")
        elif returncode == ExitCode.COMPLETED:
            if job.state != State.COMPLETING:
                job.begin_completing()
            job.complete()
        elif returncode == ExitCode.PAUSED:
            if job.state == State.RUNNING:  # the engine's own policy paused it for a person
                job.request_pause(Cause.POLICY, "engine fault policy")
            # a warm pause past its limit says so (engine.reason)
            job.mark_paused(f"{engine.reason or 'the engine checkpointed and stopped'}; resume "
                            "continues from there")
        else:
            reason = scrub_paths(_failure(returncode, engine), job)
            if not policy.auto_resume(job, reason):
                tail = stderr_tail(job)
                job.fail(f"{reason}\n\n--- engine stderr (tail) ---\n{tail}" if tail else reason)
    except IllegalTransition:
        log.exception("job %s: could not record the engine's end (exit %s)", job.pk, returncode)
    commands.close(job)
    if job.state == State.PAUSED or job.is_terminal:
        notify(job, f"job.{job.state}", {"error": job.error} if job.error else {})


def _failure(returncode: int, engine: EngineReport) -> str:
    """Why the engine failed, as the job's error says it."""
    if returncode < 0:
        return f"the engine was killed by signal {signal.Signals(-returncode).name}"
    if engine.state == JobState.CANCELLED:  # e.g. the platform shutting down (Ctrl-C)
        return (f"the engine was stopped from outside the platform "
                f"({engine.reason or 'a signal'}; exit code {returncode})")
    return engine.error or f"the engine exited with code {returncode}"
