"""Commands: the inbox takes the same commands on every rank at the same step, the handler
carries out each kind or refuses it with the reason, and answers every one with an event."""

from pathlib import Path

import pytest

from engine.anomaly import FaultManager
from engine.contract import ActionEvent, Command, CommandKind, StateEvent
from engine.runtime.commands import (
    CommandHandler,
    CommandInbox,
    CommandRefused,
    Outcome,
    PauseWait,
)
from engine.runtime.settings import LiveSettings
from engine.runtime.spec import SpecError, parse_spec


class FakeChannel:
    def __init__(self, *commands: Command, errors: tuple[str, ...] = ()):
        self.arrivals = list(commands)
        self.errors = list(errors)

    def poll(self) -> list[Command]:
        arrived, self.arrivals = self.arrivals, []
        return arrived


def test_rank0_reads_without_blocking_and_refuses_malformed_commands():
    events = []
    inbox = CommandInbox(FakeChannel(Command(CommandKind.PAUSE, id="p"),
                                     errors=("command.kind: must be one of ...",)),
                         events.append)
    assert inbox.poll(step=4) == 1  # rank 0's share of the all-reduced count
    assert inbox.poll(step=5) == 1  # nothing new; the read command waits
    assert events == [ActionEvent(step=4, action="refused", command=None,
                                  error="command.kind: must be one of ...")]


def test_every_rank_takes_the_due_commands_from_rank_0():
    pause, cancel = Command(CommandKind.PAUSE, id="p"), Command(CommandKind.CANCEL, id="c")
    sent = []

    def broadcast(box):  # rank 0 (called first here) sends its box, the others receive it
        if box[0] is not None:
            sent.append(box[0])
        else:
            box[0] = sent[-1]

    rank0 = CommandInbox(FakeChannel(pause, cancel), lambda e: None, broadcast)
    rank1 = CommandInbox(None, lambda e: None, broadcast)
    assert (rank0.poll(step=1), rank1.poll(step=1)) == (2, 0)
    rank0.due = rank1.due = 1  # the all-reduced count, as rank 0 read it before this step
    assert rank0.take() == rank1.take() == [pause]
    assert rank0.take() == rank1.take() == []  # taken once
    rank0.due = rank1.due = rank0.poll(step=2)
    assert rank0.take() == rank1.take() == [cancel]


def test_no_command_due_costs_no_collective():
    def broadcast(box):
        raise AssertionError("no broadcast without commands")

    inbox = CommandInbox(FakeChannel(), lambda e: None, broadcast)
    inbox.due = inbox.poll(step=1)
    assert inbox.take() == []


class FakeCheckpoints:
    def __init__(self, state, rollback_to: int | None = 10):
        self.state, self.rollback_to = state, rollback_to
        self.calls = []

    def save(self, to_disk: bool = True) -> Path:
        self.calls.append("save")
        return Path(f"/ckpt/step-{self.state.step:06d}")

    def persist(self) -> None:
        self.calls.append("persist")

    def rollback(self, step, name, skip_data, keep_settings=True) -> dict:
        self.calls.append(("rollback", step, name, skip_data))
        if self.rollback_to is None:
            raise CommandRefused(f"rollback: no good checkpoint matches {name or step}")
        from_step, self.state.step = self.state.step, self.rollback_to
        return {"to_step": self.rollback_to, "from_step": from_step,
                "settings": "kept" if keep_settings else "restored"}


class Optimizer:
    def set_weight_decay(self, weight_decay: float) -> None:
        self.weight_decay = weight_decay


class State:
    step = 12


class Watchdog:
    def __init__(self):
        self.calls = []

    def pause(self):
        self.calls.append("pause")

    def resume(self):
        self.calls.append("resume")


class Agreement:
    """A one-rank all-reduce that remembers each word: [commands read, past the limit]."""

    def __init__(self):
        self.words = []

    def __call__(self, word):
        self.words.append(word.tolist())


class Clock:
    """Each poll of a warm pause takes one second."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def handler(rollback_to: int | None = 10, *arrivals: list[Command],
            ) -> tuple[CommandHandler, FakeCheckpoints, list]:
    """A rank-0 handler; `arrivals`: what its channel reads at each poll of a warm pause."""
    spec = parse_spec({"name": "t", "model": {"preset": "nano"},
                       "parallel": {"nodes": 1, "procs_per_node": 2, "strategy": "NNN"},
                       "train": {"micro_batch": 2}})
    state, events = State(), []
    checkpoints = FakeCheckpoints(state, rollback_to)
    settings = LiveSettings(spec, Optimizer(), FaultManager())
    inbox = CommandInbox(PollByPoll(arrivals), events.append, broadcast=lambda box: None)
    wait = PauseWait(inbox, Watchdog(), poll_s=0, agree=Agreement(), clock=Clock())
    h = CommandHandler(spec, 2, state, checkpoints, events.append, settings, wait,
                       rebalancer=FakeRebalancer())
    return h, checkpoints, events


class FakeRebalancer:
    def steer(self, shares):
        if shares not in ("auto", [3, 1]):
            raise CommandRefused("rebalance: args.shares must sum to the global batch of 4")
        return [3, 1]


class PollByPoll(FakeChannel):
    def __init__(self, arrivals):
        super().__init__()
        self.arrivals_per_poll = list(arrivals)

    def poll(self) -> list[Command]:
        return self.arrivals_per_poll.pop(0) if self.arrivals_per_poll else []


def ack(action: str, step: int = 12, **details) -> ActionEvent:
    return ActionEvent(step=step, action=action, command=f"c-{action}", by="command",
                       details=details)


def command(kind: str, **args) -> Command:
    return Command(CommandKind(kind), args, id=f"c-{kind}")


def test_checkpoint_saves_now_and_the_run_goes_on():
    h, checkpoints, events = handler()
    assert h.act(command("checkpoint")) is None
    assert checkpoints.calls == ["save"]
    assert events == [ack("checkpoint", path="/ckpt/step-000012")]


def test_rollback_goes_back_and_is_answered_at_the_step_it_reached():
    h, checkpoints, events = handler()
    assert h.act(command("rollback", step=10, skip_data=True)) is None
    assert checkpoints.calls == [("rollback", 10, None, True)]
    assert events == [ack("rollback", step=10, to_step=10, from_step=12, settings="kept")]


def test_rollback_may_take_the_checkpoints_settings_instead_of_the_live_ones():
    h, _, events = handler()
    h.act(command("rollback", step=10, keep_settings=False))
    assert events[0].details["settings"] == "restored"
    with pytest.raises(CommandRefused, match="keep_settings must be true or false"):
        h.act(command("rollback", step=10, keep_settings="no"))


def test_rollback_by_name_without_skipping_data():
    h, checkpoints, _ = handler()
    h.act(command("rollback", checkpoint="step-000010"))
    assert checkpoints.calls == [("rollback", None, "step-000010", False)]


@pytest.mark.parametrize("args", [{}, {"step": -1}, {"step": "10"}])
def test_rollback_without_a_target_is_refused(args):
    h, checkpoints, _ = handler()
    with pytest.raises(CommandRefused, match="args.step"):
        h.act(command("rollback", **args))
    assert checkpoints.calls == []


def test_pause_checkpoints_waits_for_the_disk_and_ends_the_run():
    h, checkpoints, events = handler()
    assert h.act(command("pause")) == Outcome("pause", 12)
    assert checkpoints.calls == ["save", "persist"]
    assert events == [ack("pause", path="/ckpt/step-000012")]


def test_reshard_checkpoints_and_ends_the_run_with_the_new_layout():
    h, checkpoints, events = handler()
    outcome = h.act(command("reshard", procs_per_node=4, strategy="GGG"))
    assert (outcome.kind, outcome.step) == ("reshard", 12)
    assert (outcome.parallel["procs_per_node"], outcome.parallel["strategy"]) == (4, "GGG")
    assert outcome.parallel["nodes"] == 1  # what the command leaves out stays
    assert checkpoints.calls == ["save", "persist"]
    assert events == [ack("reshard", path="/ckpt/step-000012", parallel=outcome.parallel)]


def test_reshard_to_an_invalid_layout_is_refused_naming_the_field():
    h, checkpoints, _ = handler()
    with pytest.raises(SpecError) as refused:
        h.act(command("reshard", strategy="XYZ"))
    assert "parallel.strategy" in refused.value.errors
    assert checkpoints.calls == []


def test_reshard_is_refused_to_move_the_job_to_other_hosts():
    h, checkpoints, _ = handler()
    with pytest.raises(CommandRefused, match=r"parallel.hosts says where the job runs"):
        h.act(command("reshard", hosts=2, nodes=2))
    assert checkpoints.calls == []


def test_reshard_is_refused_unless_the_micro_batch_divides_over_the_new_ranks():
    h, checkpoints, _ = handler()
    with pytest.raises(SpecError, match=r"parallel.nodes: the global micro-batch \(2 x 2 seq"):
        h.act(command("reshard", procs_per_node=3))
    assert checkpoints.calls == []


def test_set_changes_live_settings_and_answers_with_old_and_new_values():
    h, checkpoints, events = handler()
    assert h.act(command("set", **{"train.lr": 5e-4, "train.grad_clip": 0.5})) is None
    assert (h.spec.train.lr, h.spec.train.grad_clip) == (5e-4, 0.5)
    assert events == [ack("set", changes={"train.lr": {"old": 2e-3, "new": 5e-4},
                                          "train.grad_clip": {"old": 1.0, "new": 0.5}})]
    assert checkpoints.calls == []


def test_a_bad_set_is_refused_naming_the_field_and_changes_nothing():
    h, _, events = handler()
    h.handle([command("set", **{"train.lr": -1.0, "train.grad_clip": 0.5})])
    assert [(e.action, e.kind, e.error) for e in events] == [
        ("refused", "set", "train.lr: must be a positive number")]
    assert (h.spec.train.lr, h.spec.train.grad_clip) == (2e-3, 1.0)


def test_rebalance_hands_the_shares_to_the_rebalancer_and_answers_with_them():
    h, _, events = handler()
    assert h.act(command("rebalance", shares=[3, 1])) is None
    assert h.act(command("rebalance")) is None  # no shares: follow the ranks' speeds
    assert events == [ack("rebalance", shares=[3, 1])] * 2
    assert h.handle([command("rebalance", shares=[4, 1])]) is None
    assert events[-1].error == "rebalance: args.shares must sum to the global batch of 4"


def test_cancel_ends_the_run_without_a_checkpoint():
    h, checkpoints, events = handler()
    assert h.act(command("cancel")) == Outcome("cancel", 12)
    assert checkpoints.calls == []
    assert events == [ack("cancel")]


def test_resume_is_refused_while_the_job_runs():
    h, _, _ = handler()
    with pytest.raises(CommandRefused, match="resume applies to a paused job"):
        h.act(command("resume"))


def test_handle_answers_refusals_and_stops_at_the_command_that_ends_the_run():
    h, checkpoints, events = handler(rollback_to=None)
    outcome = h.handle([command("resume"), command("rollback", step=3), command("cancel"),
                        command("checkpoint")])
    assert outcome == Outcome("cancel", 12)
    assert [(e.action, e.command, e.kind) for e in events] == [
        ("refused", "c-resume", "resume"), ("refused", "c-rollback", "rollback"),
        ("cancel", "c-cancel", None)]
    assert "no good checkpoint matches 3" in events[1].error
    assert "save" not in checkpoints.calls  # the checkpoint after the cancel never ran


def test_a_warm_pause_idles_in_memory_until_resume_and_the_run_goes_on():
    h, checkpoints, events = handler(10, [], [], [command("resume")])
    assert h.act(command("pause", mode="warm", max_s=60)) is None
    assert checkpoints.calls == []  # nothing written: the state stays in memory
    assert h.wait.agree.words == [[0, 0], [0, 0], [1, 0]]  # one agreement per poll
    assert h.wait.watchdog.calls == ["pause", "resume"]
    assert events == [
        ack("pause", mode="warm", max_s=60.0),
        StateEvent(step=12, state="paused", mode="warm"),
        ack("resume", mode="warm"),
        StateEvent(step=12, state="running", mode="warm"),
    ]


def test_a_warm_pause_past_its_limit_turns_cold():
    h, checkpoints, events = handler(10)
    outcome = h.act(command("pause", mode="warm", max_s=3))
    assert outcome == Outcome("pause", 12,
                              reason="warm pause exceeded 3 s: checkpointed and stopped")
    assert checkpoints.calls == ["save", "persist"]
    assert h.wait.agree.words[-1] == [0, 1] and len(h.wait.agree.words) == 3  # polled at 2, 3, 4 s
    assert h.wait.watchdog.calls == ["pause", "resume"]  # the checkpoint is watched


def test_while_paused_warm_commands_are_carried_out_and_a_cancel_ends_the_run():
    h, checkpoints, events = handler(10, [command("checkpoint"), command("pause", mode="warm")],
                                     [command("cancel"), command("resume")])
    assert h.act(command("pause", mode="warm")) == Outcome("cancel", 12)
    assert checkpoints.calls == ["save"]
    assert [(e.action, e.error) for e in events if isinstance(e, ActionEvent)][1:] == [
        ("checkpoint", None), ("refused", "pause: the job is already paused warm"),
        ("cancel", None)]


def test_the_commands_after_a_resume_are_carried_out_once_running():
    h, checkpoints, events = handler(10, [command("resume"), command("pause")])
    assert h.act(command("pause", mode="warm")) == Outcome("pause", 12)
    assert checkpoints.calls == ["save", "persist"]  # the cold pause that followed
    assert events[-2:] == [StateEvent(step=12, state="running", mode="warm"),
                           ack("pause", path="/ckpt/step-000012")]


@pytest.mark.parametrize(("args", "error"), [
    ({"mode": "tepid"}, "args.mode must be one of cold, warm"),
    ({"mode": "warm", "max_s": 0}, "args.max_s must be a positive number"),
    ({"mode": "warm", "max_s": "60"}, "args.max_s must be a positive number"),
])
def test_a_bad_pause_mode_or_limit_is_refused_naming_the_argument(args, error):
    h, checkpoints, _ = handler()
    with pytest.raises(CommandRefused, match=error):
        h.act(command("pause", **args))
    assert checkpoints.calls == []
