"""One launch of a job on Slurm, followed across the Slurm jobs it takes (jobs.backends.slurm
submits them), and the `slurm` backend that starts it.

`SlurmRun.poll` asks Slurm at most every SLURM_POLL_S; while Slurm holds the job pending, its
reason is the Ringside job's waiting reason. Where Slurm does not warn a running job of its time
limit (through slurmrestd), the poll does: SLURM_SIGNAL_LEAD_S before the end time Slurm
reports, it runs the batch script's warning (jobs.backends.slurm.time_limit_warning) once. The
launch usually ends with its Slurm job, except:

- a reshard onto another node count: jobs.commands delivers it to the engine as a cold pause
  (jobs.backends.slurm.resubmits); once that Slurm job ended, the job's spec takes the new
  layout (the global batch kept, as the engine's own reshard keeps it) and it is submitted
  again at the new size from the checkpoint. The job stays `resharding` until the new engine
  runs.
- a lost node: Slurm marks it down (after its SlurmdTimeout) and ends or requeues the job. The
  platform submits it again from the newest checkpoint as soon as it sees the node down (the
  old job still completing, or requeued, is cancelled): if the nodes left are at least
  `parallel.min_hosts`, on that many nodes, without the lost ones (`--exclude`, kept for the
  job's later submissions), laid out on fewer hosts as the hosts backend does (a `host_lost`
  anomaly and a `membership` event say so in its events); otherwise at its full size, waiting
  in Slurm's queue (Slurm's reason its waiting reason) until Slurm has the nodes again (a
  `host_lost` anomaly says so). Slurm's own requeue would do the latter too, but holds the job
  for its credentials' lifetime (2 minutes) even once the nodes are back, and where Slurm
  ended the job instead (its ranks failed before Slurm marked the node down) there is none.
"""

from __future__ import annotations

import logging
import signal
import time

from django.conf import settings

from engine.contract import AnomalyEvent, AnomalyKind, ExitCode, MembershipEvent
from engine.runtime.events import EventLog
from engine.runtime.spec import SpecError, layout_on_hosts, parse_spec, reshard_layout
from jobs.backends.slurm import client, resubmits, slurm, submit, time_limit_warning
from jobs.backends.slurm_calls import ALIVE, Seen, SlurmError
from jobs.launch import run_dir
from jobs.models import SUPERVISED, Command, CommandKind, Job, State

log = logging.getLogger(__name__)

CLEAN_ENDS = frozenset({ExitCode.COMPLETED, ExitCode.PAUSED, ExitCode.CANCELLED})


class SlurmRun:
    """One launch: `poll` gives its exit code once it ended (a signal's as its negative)."""

    def __init__(self, job: Job, slurm_id: str):
        self.job = job
        self.returncode: int | None = None
        self.asked_at = 0.0
        self.reason = ""
        self._follow(slurm_id)

    @property
    def ref(self) -> str:
        return f"Slurm job {self.slurm_id}"

    def poll(self) -> int | None:
        if self.returncode is not None or time.monotonic() - self.asked_at < settings.SLURM_POLL_S:
            return self.returncode
        self.asked_at = time.monotonic()
        seen = slurm().look(self.slurm_id)
        self.state = seen.state
        if seen.state == "RUNNING":
            if seen.nodes != self.placed:
                self.placed, self.nodes = seen.nodes, slurm().hostnames(seen.nodes)
            self._warn_of_time_limit(seen)
        if seen.state in ALIVE and not self._stopped(seen):
            self._waiting(seen.reason if seen.state == "PENDING" else "")
            return None
        self._waiting("")
        if self._goes_on(seen):
            return None
        self.returncode = seen.code
        return seen.code

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(settings.SLURM_POLL_S)
        return self.returncode

    def signal_all(self, sig: signal.Signals) -> None:
        """SIGTERM: to every process of a running job (the launchers stop their ranks);
        SIGKILL, or a job not running yet: cancelled outright."""
        try:
            running = sig == signal.SIGTERM and self.state == "RUNNING"
            slurm().cancel(self.slurm_id, sig if running else None)
        except SlurmError as error:  # it ended meanwhile
            log.info("job %s: %s", self.job.pk, error)

    def _follow(self, slurm_id: str) -> None:
        """Follow the Slurm job `slurm_id` from its submission on."""
        self.slurm_id, self.state = slurm_id, "PENDING"
        self.nodes: list[str] = []  # where it runs, once Slurm started it
        self.placed = ""  # the compressed node list they were read from
        self.settle_by: float | None = None  # a failed end waits this long to see a node down
        self.warned = False  # of its time limit, by the platform (`_warn_of_time_limit`)

    def _warn_of_time_limit(self, seen: Seen) -> None:
        """Where Slurm does not warn the running job of its time limit (slurmrestd), warn it as
        the batch script's trap would, once SLURM_SIGNAL_LEAD_S are left; once a run (a
        failed warning is tried again at the next look)."""
        if self.warned or slurm().warns_of_time_limit or seen.ends_at is None:
            return
        if time.time() < seen.ends_at - settings.SLURM_SIGNAL_LEAD_S:
            return
        try:
            client(*time_limit_warning(self.job))
        except SlurmError as error:
            log.warning("job %s: the time limit's warning failed: %s", self.job.pk, error)
            return
        self.warned = True
        log.info("job %s: %s ends at its time limit in %.0f s: warned", self.job.pk, self.ref,
                 seen.ends_at - time.time())

    def _stopped(self, seen: Seen) -> bool:
        """Whether the Slurm job Slurm still holds stopped running where it ran: pending again
        (Slurm requeued it), or completing with one of its nodes lost."""
        if not self.nodes or seen.state == "RUNNING":
            return False
        return seen.state == "PENDING" or bool(self._lost())

    def _goes_on(self, seen: Seen) -> bool:
        """Whether the launch goes on now that its Slurm job ended, was requeued or lost a
        node: submitted again (at a reshard's size; after a lost node), or requeued by Slurm."""
        if seen.code == ExitCode.PAUSED and self._resharded():
            return True
        # a node's failure is never the engine's clean end, whatever code Slurm gives it
        if seen.state not in ALIVE and seen.code in CLEAN_ENDS and seen.state != "NODE_FAIL":
            return False
        lost = self._lost()
        if lost is None:
            return True  # Slurm has not yet said whether a node is down
        if lost and self._steerable():
            return self._after_loss(lost)
        if seen.state in ALIVE:  # requeued by Slurm: it runs again when Slurm has the nodes
            log.warning("job %s: Slurm requeued %s (lost: %s)", self.job.pk, self.ref, lost)
            self.placed, self.nodes, self.warned = "", [], False  # its next run is warned anew
            return True
        return False

    def _lost(self) -> list[str] | None:
        """The nodes of a multi-node run that Slurm holds down; None while Slurm may still be
        finding out (`node_down_within_s` after the end)."""
        if len(self.nodes) < 2:
            return []
        lost = slurm().lost_nodes(self.nodes)
        if lost:
            return lost
        if self.settle_by is None:
            self.settle_by = time.monotonic() + slurm().node_down_within_s()
        return None if time.monotonic() < self.settle_by else []

    def _steerable(self) -> bool:
        """Whether the job may still be submitted again (not cancelled, still ours)."""
        self.job.refresh_from_db()
        return self.job.state in SUPERVISED and self.job.cancel_requested_at is None

    def _resharded(self) -> bool:
        """The engine paused for a reshard onto another node count: submitted again at it."""
        job = self.job
        if not self._steerable() or job.state != State.RESHARDING:
            return False
        command = Command.objects.filter(job=job, kind=CommandKind.RESHARD).order_by("-pk").first()
        if command is None or not resubmits(job, command.args):
            return False
        before = parse_spec(job.spec)
        layout = reshard_layout(before, command.args)
        world = layout["nodes"] * layout["procs_per_node"]
        job.adopt_layout(layout, before.train.micro_batch * before.parallel.world_size // world)
        log.info("job %s: reshard onto %s node(s): a new submission", job.pk, layout["hosts"])
        return self._submit_again()

    def _after_loss(self, lost: list[str]) -> bool:
        """Submit the job again from its newest checkpoint: on the nodes left, without the lost
        ones, if `parallel.min_hosts` allows; else at its full size, to wait in Slurm's queue
        until Slurm has the nodes again."""
        job, before = self.job, list(self.nodes)
        if self.state in ALIVE:
            self.signal_all(signal.SIGKILL)  # completing, or Slurm's requeue: ours replaces it
        spec = self._on_nodes_left(len(before) - len(lost))
        if spec is not None:
            exclude = sorted(set(job.backend_options.get("exclude", [])) | set(lost))
            Job.objects.filter(pk=job.pk).update(
                spec=spec, backend_options={**job.backend_options, "exclude": exclude})
            job.refresh_from_db()
        announce_loss(job, before, lost, went_on=spec is not None)
        return self._submit_again()

    def _on_nodes_left(self, left: int) -> dict | None:
        """The job's spec laid out on the `left` nodes; None if `parallel.min_hosts` or its
        global batch does not allow it."""
        job = self.job
        if left < (parse_spec(job.spec).parallel.min_hosts or 1):
            return None
        try:
            return layout_on_hosts(job.spec, left)
        except SpecError as error:  # the global batch does not divide over fewer ranks
            log.warning("job %s: cannot go on on %s node(s): %s", job.pk, left, error)
            return None

    def _submit_again(self) -> bool:
        """Submit the job as its spec says now and follow that; False, the job failed with
        Slurm's word, if Slurm refuses it (a size its partition does not allow, say)."""
        try:
            self._follow(submit(self.job))
        except SlurmError as error:
            self.job.fail(f"Slurm refused to take it again: {error}")
            return False
        return True

    def _waiting(self, reason: str) -> None:
        if reason != self.reason:
            self.reason = reason
            Job.objects.filter(pk=self.job.pk).update(
                waiting_reason=f"Slurm holds it pending: {reason}" if reason else "")


def announce_loss(job: Job, before: list[str], lost: list[str], went_on: bool) -> None:
    """Publish the lost nodes into the job's events, as the hosts backend does for a lost
    host: a `host_lost` anomaly, then, if it `went_on` on the nodes left, the `membership`
    change."""
    after = [name for name in before if name not in lost]
    reason = (f"Slurm node(s) {', '.join(lost)} lost: submitted again on {len(after)} node(s) "
              "without them (--exclude), from the newest checkpoint" if went_on else
              f"Slurm node(s) {', '.join(lost)} lost, and the {len(after)} left are fewer than "
              f"parallel.min_hosts: submitted again on {len(before)} node(s), to go on from the "
              "newest checkpoint once Slurm has them")
    log.warning("job %s: %s", job.pk, reason)
    events = EventLog(str(job.pk), run_dir(job) / "events.jsonl", settings.REDIS_URL)
    try:
        events.emit(AnomalyEvent(step=job.step, kind=AnomalyKind.HOST_LOST, severity="error",
                                 evidence={"lost": lost, "reason": reason}))
        if went_on:
            events.emit(MembershipEvent(step=job.step, hosts_before=before, hosts_after=after,
                                        world_size=parse_spec(job.spec).parallel.world_size,
                                        reason=reason))
    finally:
        events.close()


class SlurmBackend:
    def start(self, job: Job) -> tuple[SlurmRun, None]:
        """Submit this incarnation; its engine's launchers start when Slurm allocates."""
        return SlurmRun(job, submit(job)), None

    def release(self, job: Job) -> None:
        """Nothing is held once the Slurm job ended (the supervisor waited for it)."""


BACKEND = SlurmBackend()
