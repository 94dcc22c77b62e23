"""Commands from a person or the platform: read between steps, carried out on every rank.

`CommandInbox` is rank 0's reader made collective: rank 0 polls the control channel without
blocking, the number of commands it holds rides the step's metrics all-reduce (steering costs
no collective of its own until a command arrives), and `take` broadcasts that many so every
rank acts on the same commands at the same step. `CommandHandler` carries out one command, or
refuses it with the reason, answering each with an `action` event that names its id.

A warm pause (`pause` with args `{"mode": "warm", "max_s": N}`) holds the ranks at the step
boundary, their state in memory: `PauseWait` lets them idle until rank 0 reads a command (a
`resume` goes on training at once) or the pause outlives `max_s` and turns cold.

A `decide` command answers a proposal of the fault policy (engine.runtime.approvals).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from engine.contract import (
    WARM_PAUSE_MAX_S,
    ActionBy,
    ActionEvent,
    ActionName,
    Command,
    CommandKind,
    Event,
    PauseMode,
    ShareMode,
    StateEvent,
)
from engine.runtime.control import ControlChannel
from engine.runtime.settings import LiveSettings
from engine.runtime.spec import JobSpec, SpecError, resharded

Emit = Callable[[Event], None]


class CommandRefused(ValueError):
    """A command that cannot be carried out now; it is answered with a `refused` action."""


@dataclass
class Outcome:
    """How a run of the ranks ended: completed, pause, cancel, reshard (to `parallel`),
    restart (the fault policy's, from the snapshot just taken) or failed (a configuration
    error, `reason` its message)."""

    kind: str
    step: int
    parallel: dict | None = None
    reason: str | None = None  # said in the launcher's final `state` event


def refusal(step: int, command: Command, error: str) -> ActionEvent:
    """The `action` event that refuses `command` with the reason."""
    return ActionEvent(step=step, action=ActionName.REFUSED, command=command.id, kind=command.kind,
                       error=error)


def broadcast_from_rank0(box: list[Any]) -> None:
    dist.broadcast_object_list(box, src=0)


class CommandInbox:
    """`channel` is rank 0's (None on the other ranks); `broadcast` fills a one-item box on
    every rank with rank 0's item."""

    def __init__(self, channel: ControlChannel | None, emit: Emit,
                 broadcast: Callable[[list[Any]], None] = broadcast_from_rank0):
        self.channel = channel
        self.emit = emit
        self.broadcast = broadcast
        self.pending: list[Command] = []  # read, not yet taken
        # taken, the same on every rank, while the ranks held for a proposal: handed out next
        self.deferred: list[Command] = []
        self.due = 0  # how many of them every rank takes after this step (all-reduced)

    def poll(self, step: int) -> int:
        """Read what arrived (malformed commands are refused with the reason); returns how
        many commands wait, this rank's share of the all-reduced count."""
        if self.channel is not None:
            self.pending += self.channel.poll()
            for error in self.channel.errors:
                self.emit(ActionEvent(step=step, action=ActionName.REFUSED, command=None,
                                      error=error))
            self.channel.errors.clear()
        return len(self.pending)

    def take(self) -> list[Command]:
        """The deferred commands, then the `due` ones, the same on every rank (a collective
        when any are due)."""
        deferred, self.deferred = self.deferred, []
        if not self.due:
            return deferred
        box = [self.pending[: self.due]] if self.channel is not None else [None]
        self.broadcast(box)
        del self.pending[: self.due]
        self.due = 0
        return deferred + box[0]


class Pausable(Protocol):
    """What a warm pause suspends: the hang watchdog (idling on purpose is no hang)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


def all_reduce_sum(word: torch.Tensor) -> None:
    dist.all_reduce(word)


class PauseWait:
    """The ranks' idle loop while paused warm. Every `poll_s` rank 0 reads the control channel
    and one small all-reduce carries rank 0's word: how many commands it read (the others add
    0) and whether a rank's clock says the pause is past its limit. So every rank leaves the
    wait at the same poll; the commands themselves follow by the inbox's broadcast."""

    def __init__(self, inbox: CommandInbox, watchdog: Pausable, poll_s: float = 0.1,
                 agree: Callable[[torch.Tensor], None] = all_reduce_sum,
                 clock: Callable[[], float] = time.monotonic):
        self.inbox, self.watchdog, self.poll_s = inbox, watchdog, poll_s
        self.agree, self.clock = agree, clock
        self.holding = False

    @contextmanager
    def held(self) -> Iterator[None]:
        """The ranks are paused warm: the watchdog rests, its clock restarting on the way out
        (the paused time counts toward no op and no step)."""
        self.watchdog.pause()
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            self.watchdog.resume()

    def arrivals(self, step: int, max_s: float) -> Iterator[list[Command]]:
        """The commands as they arrive, the same on every rank, until `max_s` has passed (a
        command that arrives with the deadline still counts: a late resume wins)."""
        deadline = self.clock() + max_s
        while True:
            time.sleep(self.poll_s)
            word = torch.tensor([float(self.inbox.poll(step)), float(self.clock() >= deadline)])
            self.agree(word)
            self.inbox.due = int(word[0])
            commands = self.inbox.take()
            if commands:
                yield commands
            elif word[1] > 0:
                return


def warm_pause_limit(args: dict[str, Any]) -> float | None:
    """How long a `pause` may stay warm (`max_s`), or None for a cold one; CommandRefused
    naming the bad argument."""
    mode = args.get("mode", PauseMode.COLD)
    if mode not in tuple(PauseMode):
        raise CommandRefused(f"pause: args.mode must be one of {', '.join(PauseMode)}")
    if mode == PauseMode.COLD:
        return None
    max_s = args.get("max_s", WARM_PAUSE_MAX_S)
    if isinstance(max_s, bool) or not isinstance(max_s, int | float) or not 0 < max_s < 1e9:
        raise CommandRefused("pause: args.max_s must be a positive number of seconds")
    return float(max_s)


class Checkpoints(Protocol):
    """What the handler needs of the run's checkpoints (engine.runtime.checkpointing)."""

    def save(self, to_disk: bool = True) -> Path: ...

    def persist(self) -> None: ...

    def rollback(self, step: int | None, name: str | None, skip_data: bool,
                 keep_settings: bool = True) -> dict: ...


class HasStep(Protocol):
    step: int


class Answers(Protocol):
    """What answers a `decide` command (engine.runtime.approvals.Approvals)."""

    def answer(self, command: Command, step: int) -> None: ...


class Steers(Protocol):
    """What answers a `rebalance` command (engine.runtime.rebalance.Rebalancer)."""

    def steer(self, shares: Any) -> list[int]: ...


class CommandHandler:
    def __init__(self, spec: JobSpec, world_size: int, state: HasStep,
                 checkpoints: Checkpoints, emit: Emit, settings: LiveSettings,
                 wait: PauseWait, approvals: Answers | None = None,
                 rebalancer: Steers | None = None):
        self.spec, self.world_size, self.state = spec, world_size, state
        self.checkpoints = checkpoints
        self.emit = emit
        self.settings = settings
        self.wait = wait
        self.approvals = approvals
        self.rebalancer = rebalancer

    def handle(self, commands: list[Command]) -> Outcome | None:
        """Carry out `commands` in order until one ends the run; returns how it ends."""
        for command in commands:
            try:
                outcome = self.act(command)
            except (CommandRefused, SpecError) as e:
                self.emit(refusal(self.state.step, command, str(e)))
                continue
            if outcome is not None:
                return outcome
        return None

    def act(self, command: Command) -> Outcome | None:
        """Carry out one command on every rank; returns how the run ends, if it does. Raises
        CommandRefused (or SpecError for a bad layout) with the reason."""
        kind, args = command.kind, command.args
        if kind == CommandKind.CHECKPOINT:
            self._ack(command, path=str(self.checkpoints.save()))
        elif kind == CommandKind.ROLLBACK:
            step, name = args.get("step"), args.get("checkpoint")
            if not name and (not isinstance(step, int) or step < 0):
                raise CommandRefused("rollback needs args.step (an integer) or args.checkpoint")
            keep = args.get("keep_settings", True)  # the live settings outlive the rollback
            if not isinstance(keep, bool):
                raise CommandRefused("rollback: args.keep_settings must be true or false")
            self._ack(command, **self.checkpoints.rollback(
                step, name, bool(args.get("skip_data", False)), keep))
        elif kind == CommandKind.SET:
            self._ack(command, changes=self.settings.change(args))
        elif kind == CommandKind.PAUSE and (max_s := warm_pause_limit(args)) is not None:
            return self._pause_warm(command, max_s)
        elif kind in (CommandKind.PAUSE, CommandKind.RESHARD):
            parallel = self._new_layout(args) if kind == CommandKind.RESHARD else None
            path = self.checkpoints.save()
            self.checkpoints.persist()
            self._ack(command, path=str(path), **({"parallel": parallel} if parallel else {}))
            return Outcome(str(kind), self.state.step, parallel)
        elif kind == CommandKind.CANCEL:
            self._ack(command)
            return Outcome(str(kind), self.state.step)
        elif kind == CommandKind.DECIDE and self.approvals is not None:
            self.approvals.answer(command, self.state.step)  # it answers with its own event
        elif kind == CommandKind.REBALANCE and self.rebalancer is not None:
            self._ack(command, shares=self.rebalancer.steer(args.get("shares", ShareMode.AUTO)))
        else:
            raise CommandRefused(f"{kind}: the job is running; resume applies to a paused job")
        return None

    def _pause_warm(self, command: Command, max_s: float) -> Outcome | None:
        """Idle at this step boundary, the state in memory, until a `resume` (the commands
        after it in the same batch are carried out) or a command that ends the run; past
        `max_s` the pause turns cold: checkpoint and stop."""
        if self.wait.holding:
            raise CommandRefused("pause: the job is already paused warm")
        self._ack(command, mode=PauseMode.WARM, max_s=max_s)
        self.emit(StateEvent(step=self.state.step, state="paused", mode=PauseMode.WARM))
        with self.wait.held():
            after = self._idle(max_s)
        if isinstance(after, Outcome):
            return after
        if after is None:
            self.checkpoints.save()
            self.checkpoints.persist()
            return Outcome("pause", self.state.step,
                           reason=f"warm pause exceeded {max_s:g} s: checkpointed and stopped")
        self.emit(StateEvent(step=self.state.step, state="running", mode=PauseMode.WARM))
        return self.handle(after)

    def _idle(self, max_s: float) -> Outcome | list[Command] | None:
        """Carry out what arrives while paused warm; returns the commands after a `resume`,
        the outcome of one that ends the run, or None when `max_s` passed first."""
        for commands in self.wait.arrivals(self.state.step, max_s):
            for i, each in enumerate(commands):
                if each.kind == CommandKind.RESUME:
                    self._ack(each, mode=PauseMode.WARM)
                    return commands[i + 1:]
                outcome = self.handle([each])
                if outcome is not None:
                    return outcome
        return None

    def _new_layout(self, args: dict[str, Any]) -> dict[str, Any]:
        """The layout a reshard moves to, refused unless it is a valid spec over which the
        global micro-batch divides."""
        placed = sorted(args.keys() & {"hosts", "min_hosts", "scale_up"})
        if placed:  # the launchers of every host would have to change, not the ranks
            raise CommandRefused(f"reshard: parallel.{placed[0]} says where the job runs, "
                                 "which a reshard does not change")
        parallel = {**dataclasses.asdict(self.spec.parallel), **args}
        resharded(self.spec, parallel)
        return parallel

    def _ack(self, command: Command, **fields: Any) -> None:
        self.emit(ActionEvent(step=self.state.step, action=str(command.kind), command=command.id,
                              by=ActionBy.COMMAND, details=fields))
