"""The checkpoint list names each checkpoint's branch: one written before a rollback to an
earlier step holds a run that was trained again, so the API marks it abandoned; the page, the
CLI and the API all read it from here."""

import pytest

from jobs.models import Job
from monitor.ingest import store_events

pytestmark = pytest.mark.django_db


def checkpoint(step: int, tier: str = "disk") -> dict:
    return {"type": "checkpoint", "step": step, "path": f"/ckpt/{tier}/step-{step:06d}",
            "tier": tier, "blocking_s": 0.1, "size_bytes": 10**6, "strategy": "NNN",
            "world_size": 1}


def rollback(from_step: int, to_step: int) -> dict:
    return {"type": "action", "step": to_step, "action": "rollback", "by": "command",
            "command": "7", "from_step": from_step, "to_step": to_step}


def test_checkpoints_written_before_a_rollback_past_their_step_are_the_abandoned_branch(
        api, user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec, state="running")
    events = [checkpoint(10), checkpoint(20), checkpoint(30), checkpoint(30, "memory"),
              rollback(35, 20),  # 30 and its memory copy were trained again
              checkpoint(30), checkpoint(40),
              rollback(42, 30),  # back to the new 30: the new 40 is abandoned too
              checkpoint(40)]
    for seq, event in enumerate(events, start=1):
        event.update(job=str(job.pk), seq=seq, time=1000.0 + seq)
    store_events(job.pk, events)

    listed = api.get(f"/api/jobs/{job.pk}/checkpoints/").json()["results"]
    assert [(c["seq"], c["step"], c["tier"], c["branch"]) for c in listed] == [
        (1, 10, "disk", "live"), (2, 20, "disk", "live"),
        (3, 30, "disk", "abandoned"), (4, 30, "memory", "abandoned"),
        (6, 30, "disk", "live"), (7, 40, "disk", "abandoned"),
        (9, 40, "disk", "live")]


def test_without_a_rollback_every_checkpoint_is_live(api, user, small_spec):
    job = Job.objects.create(name="t", owner=user, spec=small_spec, state="running")
    events = [checkpoint(5), {"type": "action", "step": 6, "action": "lr_cut", "by": "policy"},
              checkpoint(10)]
    for seq, event in enumerate(events, start=1):
        event.update(job=str(job.pk), seq=seq, time=1000.0 + seq)
    store_events(job.pk, events)

    listed = api.get(f"/api/jobs/{job.pk}/checkpoints/").json()["results"]
    assert [c["branch"] for c in listed] == ["live", "live"]
