"""A checkpoint's lineage as the API shows it: the engine's record (engine.runtime.lineage),
its parents resolved to the stored checkpoints they are, where the user may see them."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from jobs.models import Checkpoint
from jobs.permissions import visible_jobs


def resolved(checkpoint: Checkpoint, user: AbstractBaseUser) -> dict[str, Any]:
    """The checkpoint's lineage with each parent, up the chain, named by its checkpoint and job
    ids (null where the platform has no such checkpoint of a job `user` may see)."""
    lineage = checkpoint.lineage
    parents = [{**link, **_stored(link, checkpoint, user)}
               for link in (lineage or {}).get("parents", [])]
    return {"checkpoint": checkpoint.pk, "job": checkpoint.job_id, "step": checkpoint.step,
            "path": checkpoint.path, "lineage": lineage, "parents": parents}


def _stored(link: dict[str, Any], child: Checkpoint, user: AbstractBaseUser) -> dict[str, Any]:
    """The row of the checkpoint a parent link names: a folder saved again (after a rollback
    or a restart) has a row per save, and the parent is the newest saved before its child."""
    rows = Checkpoint.objects.filter(job__in=visible_jobs(user), path=link.get("path", ""))
    if link.get("step") is not None:
        rows = rows.filter(step=link["step"])
    before_child = rows.exclude(job=child.job_id) | rows.filter(job=child.job_id,
                                                                seq__lt=child.seq)
    found = before_child.order_by("-seq").first()
    return {"checkpoint": found and found.pk, "job": found and found.job_id}
