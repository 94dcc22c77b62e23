"""jobs.api: the command rules the job page enables its controls by, the steering actions as
named methods of the job viewset, and cloning a job from one of its checkpoints."""

import inspect

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from engine.contract import COMMAND_RULES, CommandKind
from jobs.api import JobViewSet
from jobs.models import Job
from monitor.models import Checkpoint

pytestmark = pytest.mark.django_db


def test_the_command_rules_are_the_engine_contracts_in_lifecycle_order(api):
    response = api.get("/api/commands/")
    assert response.status_code == 200
    rules = response.json()
    assert rules["pause"] == {"allowed_in": ["running"], "moves_to": "pausing"}
    assert rules["resume"] == {"allowed_in": ["paused"], "moves_to": "queued"}
    assert rules["checkpoint"] == {"allowed_in": ["running"], "moves_to": None}
    assert rules["cancel"] == {"allowed_in": ["queued", "starting", "running", "pausing",
                                              "paused", "rolling_back", "resharding",
                                              "completing"], "moves_to": "cancelled"}
    assert {kind: (set(rule["allowed_in"]), rule["moves_to"]) for kind, rule in rules.items()} \
        == {str(kind): (set(rule.allowed_in), rule.moves_to)
            for kind, rule in COMMAND_RULES.items()}


def test_the_command_rules_need_authentication():
    assert APIClient().get("/api/commands/").status_code == 401


@pytest.mark.parametrize("kind", list(CommandKind))
def test_each_steering_action_is_a_method_of_the_viewset_under_its_own_name(kind):
    method = JobViewSet.__dict__[kind]
    assert inspect.isfunction(method) and method.__name__ == kind
    # written in the class body (under its decorators), not made by a factory and renamed
    written = inspect.unwrap(method)
    assert written.__qualname__ == f"JobViewSet.{kind}"
    assert f"def {kind}(self, request" in inspect.getsource(written)
    assert method.mapping == {"post": kind} and method.detail
    assert reverse(f"job-{kind}", args=[7]) == f"/api/jobs/7/{kind}/"


@pytest.fixture
def checkpointed(user, small_spec, tmp_path) -> Job:
    job = Job.objects.create(name="orig", owner=user, spec=small_spec)
    for seq, tier in [(1, "disk"), (2, "memory")]:
        (tmp_path / f"step-{seq}").mkdir()
        Checkpoint.objects.create(job=job, seq=seq, step=seq, time=0.0, tier=tier,
                                  path=str(tmp_path / f"step-{seq}"))
    return job


def test_a_clone_starts_from_the_disk_checkpoint_it_names_under_its_own_name(api, checkpointed):
    disk = checkpointed.stored_checkpoints.get(tier="disk")
    response = api.post(f"/api/jobs/{checkpointed.pk}/clone/",
                        {"name": "copy", "checkpoint": disk.pk}, format="json")
    assert response.status_code == 201, response.json()
    clone = Job.objects.get(pk=response.json()["id"])
    assert (clone.name, clone.resume_from, clone.state) == ("copy", disk.path, "queued")
    assert clone.spec == {**checkpointed.spec, "name": "copy"}


def test_a_clone_without_a_body_is_a_fresh_job_under_the_originals_name(api, checkpointed):
    response = api.post(f"/api/jobs/{checkpointed.pk}/clone/")
    assert response.status_code == 201, response.json()
    clone = Job.objects.get(pk=response.json()["id"])
    assert (clone.name, clone.resume_from) == ("orig", "")
    assert clone.spec == {**checkpointed.spec, "name": "orig"}


def test_a_memory_tier_checkpoint_cannot_seed_a_clone(api, checkpointed):
    memory = checkpointed.stored_checkpoints.get(tier="memory")
    jobs = Job.objects.count()
    response = api.post(f"/api/jobs/{checkpointed.pk}/clone/", {"checkpoint": memory.pk},
                        format="json")
    assert response.status_code == 400
    assert "pick a disk one" in " ".join(response.json()["checkpoint"])
    assert Job.objects.count() == jobs
