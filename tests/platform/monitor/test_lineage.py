"""GET /api/checkpoints/<id>/lineage/: what made a checkpoint, as its event carried it, with
each parent up the chain resolved to the checkpoint (and job) the platform stored it as; only
for the owner, and resolving only to checkpoints the caller may see."""

import pytest
from rest_framework.test import APIClient

from jobs.models import ApiToken, Checkpoint, Job
from monitor.ingest import store_events

pytestmark = pytest.mark.django_db

ORIGIN = "/runs/1/checkpoints/step-000007"


def saved(job: Job, seq: int, step: int, parents: list[dict]) -> dict:
    return {"type": "checkpoint", "job": str(job.pk), "seq": seq, "time": 1000.0 + seq,
            "step": step, "path": f"/runs/{job.pk}/checkpoints/step-{step:06d}", "tier": "disk",
            "blocking_s": 0.1, "size_bytes": 10**6, "strategy": "NNN", "world_size": 1,
            "lineage": {"code_version": "git:abc", "spec_sha256": "5e", "step": step,
                        "sources": [{"name": "web", "manifest_sha256": "m1",
                                     "tokenizer_sha256": "t1", "tokens": step * 128}],
                        "parents": parents}}


@pytest.fixture
def chain(user, small_spec):
    """A job whose checkpoint 7 a second job was initialised from; the second rolled back to
    its step 5 (saved again later: two rows of the same folder) and saved step 10 after."""
    origin = Job.objects.create(name="origin", owner=user, spec=small_spec, state="completed")
    store_events(origin.pk, [{**saved(origin, 1, 7, []), "path": ORIGIN}])
    child = Job.objects.create(name="child", owner=user, spec=small_spec, state="running")
    init = {"kind": "init_from", "path": ORIGIN, "step": 7}
    five = f"/runs/{child.pk}/checkpoints/step-000005"
    store_events(child.pk, [saved(child, 1, 5, [init]), saved(child, 2, 10, [init]),
                            saved(child, 4, 10, [{"kind": "rollback", "path": five, "step": 5},
                                                 init]),
                            saved(child, 5, 5, [{"kind": "resume", "path": five, "step": 5},
                                                init])])
    return origin, child


def test_the_lineage_names_both_parents_of_a_rollback_after_an_init_from(api, chain):
    origin, child = chain
    after = Checkpoint.objects.get(job=child, seq=4)
    body = api.get(f"/api/checkpoints/{after.pk}/lineage/").json()
    assert (body["checkpoint"], body["job"], body["step"]) == (after.pk, child.pk, 10)
    assert body["lineage"]["sources"][0] == {"name": "web", "manifest_sha256": "m1",
                                             "tokenizer_sha256": "t1", "tokens": 1280}
    rolled_back_to = Checkpoint.objects.get(job=child, seq=1)  # not the later save of step 5
    assert [(p["kind"], p["step"], p["checkpoint"], p["job"]) for p in body["parents"]] == [
        ("rollback", 5, rolled_back_to.pk, child.pk),
        ("init_from", 7, Checkpoint.objects.get(job=origin).pk, origin.pk)]


def test_another_users_checkpoint_is_not_found_and_not_named_as_a_parent(
        api, chain, other_user, small_spec):
    origin, child = chain
    theirs = APIClient()
    theirs.credentials(HTTP_AUTHORIZATION="Token "
                       + ApiToken.objects.create(user=other_user, name="t").key)
    mine = Checkpoint.objects.get(job=child, seq=4)
    assert theirs.get(f"/api/checkpoints/{mine.pk}/lineage/").status_code == 404

    # their job initialised from my checkpoint: the path is mine, the id is not theirs to see
    job = Job.objects.create(name="theirs", owner=other_user, spec=small_spec, state="running")
    store_events(job.pk, [saved(job, 1, 3, [{"kind": "init_from", "path": ORIGIN, "step": 7}])])
    body = theirs.get(f"/api/checkpoints/{Checkpoint.objects.get(job=job).pk}/lineage/").json()
    assert body["parents"] == [{"kind": "init_from", "path": ORIGIN, "step": 7,
                                "checkpoint": None, "job": None}]


def test_a_checkpoint_saved_before_lineages_has_none(api, user, small_spec):
    job = Job.objects.create(name="old", owner=user, spec=small_spec, state="completed")
    event = saved(job, 1, 5, [])
    del event["lineage"]
    store_events(job.pk, [event])
    body = api.get(f"/api/checkpoints/{Checkpoint.objects.get(job=job).pk}/lineage/").json()
    assert body["lineage"] is None and body["parents"] == []
