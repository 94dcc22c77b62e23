"""The prepare task: a dataset tokenised once, on a worker, into the platform's storage.

`queue` moves the dataset to preparing and sends `prepare_dataset` once the transaction
commits. The task runs the engine's prepare in a child process (engine.data.prepare_pipe) that
dies with its worker, writes each progress report to the dataset's row (at most every
PROGRESS_EVERY_S: the page and the API poll it) and ends it ready with the manifest, or failed
with the message. A prepare that was killed (its worker lost) leaves its finished shards: queued
again, the engine resumes from the last of them. A preparing dataset whose heartbeat is older
than STALE_AFTER_S has lost its worker and may be queued again.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from common.services import engine_env, python_module
from datasets.models import Dataset, DatasetState, prepared_folder
from engine.runtime.spec import scrub_paths
from jobs.confinement import data_roots, uploads_dir
from jobs.launch import die_with_parent

PREPARE = "datasets.tasks.prepare_dataset"
PROGRESS_EVERY_S = 0.5
STALE_AFTER_S = 30.0


def stale(dataset: Dataset) -> bool:
    """Whether a preparing dataset's prepare stopped beating (its worker was lost)."""
    return dataset.heartbeat_at is None or (
        timezone.now() - dataset.heartbeat_at > timedelta(seconds=STALE_AFTER_S))


def queue(dataset: Dataset) -> None:
    """Mark `dataset` preparing and send its prepare once the transaction commits."""
    dataset.record(DatasetState.PREPARING, error="", folder=prepared_folder(dataset.pk))
    transaction.on_commit(lambda: prepare_dataset.delay(dataset.pk))


def _order(dataset: Dataset) -> dict:
    return {"sources": dataset.sources, "tokenizer": dataset.tokenizer,
            "out": dataset.folder, "holdout": dataset.holdout,
            "roots": data_roots(dataset.owner), "workers": os.cpu_count() or 1,
            "shard_bytes": settings.DATASET_SHARD_BYTES}


@shared_task(name=PREPARE)
def prepare_dataset(dataset_id: int) -> str:
    """Prepare dataset `dataset_id` to its end; returns its state."""
    dataset = Dataset.objects.select_related("owner").filter(pk=dataset_id).first()
    if dataset is None or dataset.state != DatasetState.PREPARING:
        return dataset.state if dataset else "deleted"
    with tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen(python_module("engine.data.prepare_pipe"), env=engine_env(),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                 text=True, preexec_fn=die_with_parent)
        child.stdin.write(json.dumps(_order(dataset)))
        child.stdin.close()
        manifest = _follow(dataset, child)
        child.wait()
        stderr.seek(0)
        error = stderr.read().strip()
    if child.returncode == 0 and manifest is not None:
        dataset.record(DatasetState.READY, manifest=manifest, progress=dataset.progress,
                       prepared_at=timezone.now())
    else:
        message = error.splitlines()[-1:] or [f"the prepare exited with code {child.returncode}"]
        dataset.record(DatasetState.FAILED, error=scrub_paths(
            message[0], [str(uploads_dir(dataset.owner))]))
    return dataset.state


def _follow(dataset: Dataset, child: subprocess.Popen) -> dict | None:
    """Each progress report onto the dataset's row (throttled); the manifest, when one came."""
    written = 0.0
    for line in child.stdout:
        report = json.loads(line)
        if "manifest" in report:
            return report["manifest"]
        dataset.progress = report["progress"]  # the last is written with the outcome
        if time.monotonic() - written >= PROGRESS_EVERY_S:
            dataset.record(progress=dataset.progress)
            written = time.monotonic()
    return None
