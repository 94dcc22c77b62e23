"""jobs.serializers: a request body's validated data is all its action uses: a command's args
as stored (what the user gave) and as the engine takes them, a clone's name and starting point."""

import pytest

from jobs.models import Job
from jobs.serializers import CloneBody, CommandBody, ReshardBody, RollbackBody
from monitor.models import Checkpoint
from tests.platform.services import stored_checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(user, small_spec) -> Job:
    return Job.objects.create(name="orig", owner=user, spec=small_spec)


@pytest.fixture
def on_disk(job, tmp_path) -> Checkpoint:
    return Checkpoint.objects.create(job=job, seq=1, step=2, time=0.0, tier="disk",
                                     path=stored_checkpoint(tmp_path / "step-2"))


def validated(body_class, job: Job, data: dict) -> dict:
    body = body_class(data=data, context={"job": job})
    assert body.is_valid(), body.errors
    return body.validated_data


def test_a_command_without_fields_has_empty_args_for_the_platform_and_the_engine(job):
    assert validated(CommandBody, job, {}) == {"args": {}, "engine_args": {}}


def test_a_rollback_to_a_checkpoint_stores_its_id_and_gives_the_engine_its_path(job, on_disk):
    assert validated(RollbackBody, job, {"checkpoint": on_disk.pk, "skip_data": True}) == {
        "args": {"checkpoint": on_disk.pk, "skip_data": True},
        "engine_args": {"checkpoint": on_disk.path, "skip_data": True}}


def test_a_rollback_to_a_step_gives_both_the_same_step(job):
    assert validated(RollbackBody, job, {"step": 3}) == {
        "args": {"step": 3, "skip_data": False}, "engine_args": {"step": 3, "skip_data": False}}


def test_a_reshard_gives_both_the_layout(job):
    layout = {"strategy": "NGG", "nodes": 1, "procs_per_node": 2}
    assert validated(ReshardBody, job, layout) == {"args": layout, "engine_args": layout}


def test_a_clone_gives_the_new_jobs_name_and_the_path_it_resumes_from(job, on_disk):
    assert validated(CloneBody, job, {"name": "copy", "checkpoint": on_disk.pk}) == {
        "name": "copy", "resume_from": on_disk.path}
    assert validated(CloneBody, job, {}) == {"name": "orig", "resume_from": ""}
