"""Rebalance through the API: the shares are checked against the job's layout and batch before
anything is stored, delivered like every command and audited; a one-rank job is refused."""

import pytest

from jobs.models import AuditEntry, Command, Job
from tests.platform.jobs.test_steering import control_commands

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def four_ranks(user, small_spec) -> Job:
    """A running job of 2 x 2 ranks, micro_batch 2 and grad_accum 2: 16 samples a step."""
    small_spec["parallel"] = {"nodes": 2, "procs_per_node": 2, "strategy": "NNG"}
    small_spec["train"]["grad_accum"] = 2
    job = Job.objects.create(name="r", owner=user, spec=small_spec)
    job.start(supervisor="test")
    job.mark_running()
    return job


@pytest.mark.parametrize("body, shares", [
    ({"shares": [6, 4, 4, 2]}, [6, 4, 4, 2]), ({"shares": "even"}, "even"), ({}, "auto")])
def test_rebalance_is_delivered_with_its_shares_and_audited(api, four_ranks, body, shares):
    response = api.post(f"/api/jobs/{four_ranks.pk}/rebalance/", body, format="json")
    assert response.status_code == 202, response.json()
    sent = response.json()
    assert (sent["kind"], sent["state"], sent["args"]) == ("rebalance", "delivered",
                                                           {"shares": shares})
    assert control_commands(four_ranks) == [{"kind": "rebalance", "id": str(sent["id"]),
                                             "args": {"shares": shares}}]
    assert AuditEntry.objects.get(action="job.rebalance").details["command"] == sent["id"]


@pytest.mark.parametrize("shares, error", [
    ([6, 4, 4, 3], "must sum to the global batch of 16 samples"),
    ([8, 4, 3, 1], "each rank needs at least 2 (one per micro-step)"),
    ([8, 8], "must be a list of 4 whole numbers of samples"),
    ([4, 4, 4, True], "must be a list of 4 whole numbers of samples"),
    ("fast", "must be a list of 4 whole numbers of samples"),
])
def test_shares_that_cannot_split_the_batch_answer_400_naming_the_field(
        api, four_ranks, shares, error):
    response = api.post(f"/api/jobs/{four_ranks.pk}/rebalance/", {"shares": shares},
                        format="json")
    assert response.status_code == 400
    assert response.json()["shares"][0].startswith(error)
    assert not Command.objects.exists() and control_commands(four_ranks) == []


def test_a_one_rank_job_has_nothing_to_rebalance(api, running):
    response = api.post(f"/api/jobs/{running.pk}/rebalance/", {}, format="json")
    assert response.status_code == 400
    assert "one data-parallel rank" in response.json()["shares"][0]
    assert not Command.objects.exists()


def test_rebalance_needs_a_running_job(api, user, small_spec):
    small_spec["parallel"] = {"nodes": 1, "procs_per_node": 2}
    queued = Job.objects.create(name="q", owner=user, spec=small_spec)
    response = api.post(f"/api/jobs/{queued.pk}/rebalance/", {}, format="json")
    assert response.status_code == 409
