"""Exporting a job's checkpoint as a Hugging Face model folder, never in the web process.

`disk_checkpoint` finds the checkpoint (or says why it cannot be exported), `start` records an
`Export` and queues `export_checkpoint`; the Celery task runs `python -m engine.export` in a
child process (it imports torch and transformers, and their memory goes back when it exits)
into `<RUNS_DIR>/<job id>/exports/<checkpoint name>/` and records how it went: done with the
engine's summary, or failed with its message.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.db import transaction

from common.services import engine_env, python_module
from engine.contract import CheckpointTier
from jobs.models import Checkpoint, Export, ExportState, Job

EXPORT_TIMEOUT_S = 3600.0


class CheckpointRefused(Exception):
    """The checkpoint cannot be exported (or evaluated); `status` is the HTTP answer (404 or
    409)."""

    def __init__(self, status: int, reason: str):
        self.status = status
        super().__init__(reason)


def disk_checkpoint(job: Job, checkpoint_id: int, purpose: str = "export") -> Checkpoint:
    """`job`'s checkpoint `checkpoint_id`, if it is a disk checkpoint that still exists;
    `purpose` (export, evaluate) says what the refusal asks for instead."""
    found = Checkpoint.objects.filter(job=job, pk=checkpoint_id).first()
    if found is None:
        raise CheckpointRefused(404, f"job {job.pk} has no checkpoint {checkpoint_id}")
    if found.tier != CheckpointTier.DISK:
        raise CheckpointRefused(409, f"checkpoint {checkpoint_id} (step {found.step}) is a "
                                     f"{found.tier or 'memory'}-tier snapshot; {purpose} a "
                                     "disk one")
    if not found.available:
        raise CheckpointRefused(409, f"checkpoint {checkpoint_id} (step {found.step}) was deleted "
                                     "by the job's retention (checkpoint.keep)")
    return found


def start(checkpoint: Checkpoint) -> Export:
    """Queue the export of `checkpoint`, or return the one under way. A finished export
    (done or failed) is done again: the folder is rewritten."""
    out_dir = settings.RUNS_DIR / str(checkpoint.job_id) / "exports" / Path(checkpoint.path).name
    with transaction.atomic():
        export, created = Export.objects.select_for_update().get_or_create(
            checkpoint=checkpoint, defaults={"out_dir": str(out_dir)})
        if not created and export.state in (ExportState.PENDING, ExportState.RUNNING):
            return export
        export.state, export.error, export.summary = ExportState.PENDING, "", {}
        export.out_dir = str(out_dir)
        export.save()
        transaction.on_commit(lambda: export_checkpoint.delay(export.pk))
    return export


@shared_task(name="jobs.exports.export_checkpoint")
def export_checkpoint(export_id: int) -> str:
    """Run the export of `export_id` to its end; returns its state."""
    export = Export.objects.select_related("checkpoint").get(pk=export_id)
    export.record(ExportState.RUNNING)
    try:
        done = subprocess.run(
            python_module("engine.export", export.checkpoint.path, export.out_dir),
            env=engine_env(), capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        export.record(ExportState.FAILED, error=f"the export took over {EXPORT_TIMEOUT_S:g} s")
        return export.state
    if done.returncode == 0:
        export.record(ExportState.DONE, summary=json.loads(done.stdout))
    else:  # engine.export prints one line naming what it refused; a crash, its traceback
        message = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        export.record(ExportState.FAILED, error=message[0])
    return export.state
