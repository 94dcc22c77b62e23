"""jobs.bodies: a request body's validated data are all its action uses: a command's args as
stored (what the user gave, its defaults filled in), with `engine_args()` the same command as
the engine takes it; a clone's name and starting point."""

import pytest

from jobs.bodies import CloneBody, CommandBody, PauseBody, ReshardBody, RollbackBody, SetBody
from jobs.models import Checkpoint, Job
from tests.platform.services import stored_checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(user, small_spec) -> Job:
    return Job.objects.create(name="orig", owner=user, spec=small_spec)


@pytest.fixture
def on_disk(job, tmp_path) -> Checkpoint:
    return Checkpoint.objects.create(job=job, seq=1, step=2, time=0.0, tier="disk",
                                     path=stored_checkpoint(tmp_path / "step-2"))


def checked(body_class, job: Job, data):
    body = body_class(data=data, context={"job": job})
    assert body.is_valid(), body.errors
    return body


def validated(body_class, job: Job, data: dict) -> dict:
    return checked(body_class, job, data).validated_data


def test_a_command_without_fields_has_empty_args_for_the_platform_and_the_engine(job):
    body = checked(CommandBody, job, {})
    assert body.validated_data == {} and body.engine_args() == {}


def test_a_command_body_must_be_a_json_object(job):
    for body_class in (CommandBody, SetBody):
        body = body_class(data=["train.lr", 0.1], context={"job": job})
        assert not body.is_valid()
        assert body.errors == {"non_field_errors": ["the body must be a JSON object"]}


def test_a_rollback_to_a_checkpoint_stores_its_id_and_gives_the_engine_its_path(job, on_disk):
    body = checked(RollbackBody, job, {"checkpoint": on_disk.pk, "skip_data": True})
    assert body.validated_data == {"checkpoint": on_disk.pk, "skip_data": True}
    assert body.engine_args() == {"checkpoint": on_disk.path, "skip_data": True}


def test_a_rollback_to_a_step_gives_both_the_same_step(job):
    body = checked(RollbackBody, job, {"step": 3})
    assert body.validated_data == body.engine_args() == {"step": 3, "skip_data": False}


def test_a_reshard_gives_both_the_layout(job):
    layout = {"strategy": "NGG", "nodes": 1, "procs_per_node": 2}
    body = checked(ReshardBody, job, layout)
    assert body.validated_data == body.engine_args() == layout


def test_a_warm_pause_tells_the_engine_the_platforms_limit_when_the_body_gives_none(job,
                                                                                    settings):
    body = checked(PauseBody, job, {"mode": "warm"})
    assert body.validated_data == {"mode": "warm"}
    assert body.engine_args() == {"mode": "warm", "max_s": settings.JOB_WARM_PAUSE_MAX_S}


def test_live_settings_are_stored_as_given_and_sent_as_applied(job):
    body = checked(SetBody, job, {"train.lr": 1})
    assert body.validated_data == {"train.lr": 1}
    sent = body.engine_args()["train.lr"]
    assert sent == 1.0 and isinstance(sent, float)


def test_a_clone_gives_the_new_jobs_name_and_the_path_it_resumes_from(job, on_disk):
    assert validated(CloneBody, job, {"name": "copy", "checkpoint": on_disk.pk}) == {
        "name": "copy", "resume_from": on_disk.path}
    assert validated(CloneBody, job, {}) == {"name": "orig", "resume_from": ""}
