"""jobs.commands: how a command's life ends when the run ends before the engine answered."""

import pytest

from jobs.commands import close, issue
from jobs.models import Cause, CommandKind, State

pytestmark = pytest.mark.django_db


def test_a_cancel_the_supervisor_carried_out_by_signal_is_done_and_the_rest_refused(running):
    change = issue(running, CommandKind.SET, {"train.lr": 0.01}, actor="ada", cause=Cause.USER)
    cancel = issue(running, CommandKind.CANCEL, {}, actor="ada", cause=Cause.USER)
    assert cancel.state in ("pending", "delivered")  # the engine never answered it
    running.finish_cancel("engine stopped on request (exit code -15)")
    close(running)
    change.refresh_from_db()
    cancel.refresh_from_db()
    assert (cancel.state, cancel.result) == ("done", {"state": State.CANCELLED})
    assert change.state == "refused"
    assert change.result["error"] == "the run ended (cancelled) before the engine acted on it"


def test_a_cancel_open_when_the_run_failed_is_refused(running):
    cancel = issue(running, CommandKind.CANCEL, {}, actor="ada", cause=Cause.USER)
    running.fail("CUDA error")  # the run ended another way before the cancel reached it
    close(running)
    cancel.refresh_from_db()
    assert (cancel.state, cancel.result["error"]) == (
        "refused", "the run ended (failed) before the engine acted on it")
