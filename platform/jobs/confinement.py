"""What a user's job spec may name on the platform: the data it reads, never where it writes.

A job's checkpoints go where the platform assigns (jobs.launch.checkpoint_folder), so
`checkpoint.dir` is refused; the engine's own command line, one user's tool, keeps it. Dataset
globs, the tokenizer and a `model.init_from` folder must lie under the user's data roots (their
uploads folder and the operator's RINGSIDE_DATA_ROOTS), by real path; a relative path is taken
in the uploads folder. `model.init_from` may also name a checkpoint the user may read, as
`{"job": ID, "checkpoint": ID}` (or by the path the platform stored for it, as a clone
carries it). `train.data.mix` names datasets, resolved to their prepared folders
(datasets.mix). The stored spec holds the resolved paths, and the engine, given the same roots
(`data.roots`), checks them again when it opens them (engine.runtime.confine).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from rest_framework import serializers

from engine.contract import CheckpointTier, is_url
from engine.runtime.spec import OUTSIDE, SpecError, expand, glob_base, is_under
from jobs.bodies import job_checkpoint
from jobs.mixtures import mixtures
from jobs.models import Checkpoint, Job
from jobs.permissions import visible_jobs

CHECKPOINT_DIR = ("set by the platform: a job's checkpoints live in the storage it assigns "
                  "(to start from a checkpoint, use model.init_from {\"job\": ID, "
                  "\"checkpoint\": ID})")


def uploads_dir(user: AbstractBaseUser) -> Path:
    """The folder of `user`'s uploaded files (POST /api/files/)."""
    return settings.UPLOADS_DIR / str(user.pk)


def data_roots(user: AbstractBaseUser) -> list[str]:
    """The folders (and object-store prefixes) `user`'s jobs may read from."""
    return [str(uploads_dir(user)), *settings.DATA_ROOTS]


def confine(data: Any, user: AbstractBaseUser, errors: dict[str, str]) -> Any:
    """The spec `data` with each path it reads resolved to its real path; what it may not name
    is added to `errors` by dotted field. Anything that is not of the right type is left for
    parse_spec to name."""
    if not isinstance(data, dict):
        return data
    data = copy.deepcopy(data)
    if "data" in data:
        errors["data"] = "set by the platform: the folders a job may read"
    if isinstance(data.get("checkpoint"), dict) and data["checkpoint"].get("dir"):
        errors["checkpoint.dir"] = CHECKPOINT_DIR
    train = data.get("train")
    dataset = train.get("dataset") if isinstance(train, dict) else None
    if isinstance(dataset, dict):
        _confine_dataset(dataset, user, errors)
    mixtures().resolve(data, user, errors)
    model = data.get("model")
    if isinstance(model, dict) and model.get("init_from"):
        model["init_from"] = _init_from(model["init_from"], user, errors)
    evaluation = data.get("eval")
    tasks = evaluation.get("tasks") if isinstance(evaluation, dict) else None
    if isinstance(tasks, str) and tasks:  # read by the job's evaluations (jobs.evaluations)
        evaluation["tasks"] = resolved(tasks, user, "eval.tasks", errors)
    return data


def _confine_dataset(dataset: dict, user: AbstractBaseUser, errors: dict[str, str]) -> None:
    paths = dataset.get("paths")
    if isinstance(paths, list):
        dataset["paths"] = [resolved_pattern(p, user, f"train.dataset.paths.{i}", errors)
                            if isinstance(p, str) else p for i, p in enumerate(paths)]
    tokenizer = dataset.get("tokenizer")
    if isinstance(tokenizer, str) and tokenizer != "bytes":
        field = "train.dataset.tokenizer"
        dataset["tokenizer"] = resolved(tokenizer, user, field, errors)
        if field not in errors and not Path(dataset["tokenizer"]).is_file():
            errors[field] = "no such file under your data roots"


def in_uploads(path: str, user: AbstractBaseUser) -> str:
    """`path` as the user means it: a relative one is in their uploads folder."""
    return path if is_url(path) or os.path.isabs(path) else str(uploads_dir(user) / path)


def resolved(path: str, user: AbstractBaseUser, field: str, errors: dict[str, str]) -> str:
    """`path`'s real path (a URL as it is), or `path` with an error if outside the roots:
    the same error whether or not anything is there."""
    path = in_uploads(path, user)
    if not is_under(path, data_roots(user)):
        errors[field] = OUTSIDE
        return path
    return path if is_url(path) else os.path.realpath(path)


def resolved_pattern(pattern: str, user: AbstractBaseUser, field: str,
                     errors: dict[str, str]) -> str:
    """A dataset glob with its literal folder resolved; an error unless it starts inside the
    roots and matches files there, and only there."""
    pattern = in_uploads(pattern, user)
    if is_url(pattern):
        errors[field] = "the engine reads datasets from files, not object-store URLs"
        return pattern
    base = glob_base(pattern)
    real_base = resolved(base, user, field, errors)
    if field in errors:
        return pattern
    rest = os.path.relpath(pattern, base)
    real = real_base if rest == "." else os.path.join(real_base, rest)
    try:
        expand(real, data_roots(user), field)
    except SpecError as e:
        errors.update(e.errors)
    return real


def _init_from(value: Any, user: AbstractBaseUser, errors: dict[str, str]) -> Any:
    """The folder `model.init_from` names: a checkpoint the user may read, or a folder
    under their data roots."""
    field = "model.init_from"
    if isinstance(value, dict):
        if set(value) != {"job", "checkpoint"} or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
            errors[field] = ("a folder under your data roots, or {\"job\": ID, \"checkpoint\": "
                             "ID} naming a disk checkpoint of one of your jobs")
            return value
        return _checkpoint_path(user, value["job"], value["checkpoint"], errors)
    if not isinstance(value, str) or readable_checkpoint(user, value):
        return value
    return resolved(value, user, field, errors)


def _checkpoint_path(user: AbstractBaseUser, job_id: int, checkpoint_id: int,
                     errors: dict[str, str]) -> str:
    field = "model.init_from"
    job = visible_jobs(user).filter(pk=job_id).first()
    # another user's job reads as a job without that checkpoint: nothing tells it exists
    if job is None:
        errors[field] = f"job {job_id} has no checkpoint {checkpoint_id}"
        return ""
    try:
        found = job_checkpoint(job, checkpoint_id)
    except serializers.ValidationError as e:
        errors[field] = " ".join(map(str, e.detail))
        return ""
    if found.tier != CheckpointTier.DISK:
        errors[field] = f"checkpoint {checkpoint_id} is in the memory tier; pick a disk one"
        return ""
    return found.path


def readable_checkpoint(user: AbstractBaseUser, path: str) -> bool:
    """Whether `path` is a disk checkpoint, still kept, of a job `user` may read."""
    found = Checkpoint.objects.filter(job__in=visible_jobs(user), path=path,
                                      tier=CheckpointTier.DISK).first()
    return found is not None and found.available


def engine_roots(job: Job) -> list[str]:
    """What the engine may read for `job` (`data.roots`): its owner's data roots, the
    checkpoint its `model.init_from` names and the prepared folders of its datasets, if its
    owner may still read them."""
    init_from = job.spec.get("model", {}).get("init_from", "")
    extra = [init_from] if init_from and readable_checkpoint(job.owner, init_from) else []
    return [*data_roots(job.owner), *extra, *mixtures().folders(job)]
