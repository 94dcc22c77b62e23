"""The Job model owns its lifecycle: legal moves write a JobEvent, illegal ones raise."""

import pytest

from jobs.models import TRANSITIONS, Cause, IllegalTransition, Job, JobEvent, State

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(user, small_spec):
    return Job.objects.create(name="t", owner=user, spec=small_spec)


def test_a_job_starts_queued_and_finished_runs_record_every_transition(job):
    assert job.state == State.QUEUED
    job.start()
    job.mark_running()
    job.begin_completing()
    job.complete()
    assert job.state == State.COMPLETED
    assert job.started_at is not None and job.finished_at >= job.started_at
    moves = list(job.transitions.values_list("from_state", "to_state", "cause"))
    assert moves == [
        ("queued", "starting", Cause.WORKER),
        ("starting", "running", Cause.ENGINE),
        ("running", "completing", Cause.ENGINE),
        ("completing", "completed", Cause.WORKER),
    ]


def test_an_illegal_transition_names_the_current_state_and_changes_nothing(job):
    job.start()
    job.mark_running()
    job.begin_completing()
    job.complete()
    with pytest.raises(IllegalTransition, match="job .* is completed; it cannot become running"):
        job.transition(State.RUNNING, Cause.USER)
    job.refresh_from_db()
    assert job.state == State.COMPLETED
    assert JobEvent.objects.filter(job=job).count() == 4


def test_terminal_states_have_no_way_out_and_every_state_is_in_the_table():
    assert set(TRANSITIONS) == set(State.values)
    for state in (State.COMPLETED, State.FAILED, State.CANCELLED):
        assert TRANSITIONS[state] == frozenset()


def test_failing_keeps_the_error_message(job):
    job.start()
    job.fail("rank 1: exit code 1")
    assert job.state == State.FAILED
    assert job.error == "rank 1: exit code 1"
    assert job.transitions.last().message == "rank 1: exit code 1"


def test_cancelling_a_queued_job_is_immediate_and_names_the_requester(job):
    job.request_cancel(Cause.API_TOKEN, "ada")
    assert job.state == State.CANCELLED
    event = job.transitions.get()
    assert (event.from_state, event.to_state, event.cause, event.actor) == (
        "queued", "cancelled", "api_token", "ada")


def test_cancelling_a_running_job_is_a_request_its_supervisor_completes(job):
    job.start()
    job.mark_running()
    job.request_cancel(Cause.USER, "ada")
    assert job.state == State.RUNNING and job.cancel_requested_at is not None
    job.finish_cancel("engine stopped on request")
    event = job.transitions.last()
    assert (event.from_state, event.to_state, event.cause, event.actor) == (
        "running", "cancelled", "user", "ada")


def test_a_finished_job_cannot_be_cancelled(job):
    job.start()
    job.fail("boom")
    with pytest.raises(IllegalTransition, match="is failed"):
        job.request_cancel(Cause.USER, "ada")
    job.refresh_from_db()
    assert job.cancel_requested_at is None
