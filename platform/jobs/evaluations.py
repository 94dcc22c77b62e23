"""Evaluating a job's checkpoint, never in the web process.

`start` records an `Evaluation` and queues `evaluate_checkpoint`; the Celery task runs
`python -m engine.evaluate` in a child process (torch's memory goes back when it exits) on
the job's engine spec (reading only under its owner's data roots, the task file included)
into `<RUNS_DIR>/<job id>/evaluations/<evaluation id>/`, and records how it went: done with
the engine's summary, or failed with its message. The engine keeps a record per scored
item there, so an evaluation run again (its worker lost) resumes where it stopped.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.db import transaction
from rest_framework import serializers

from jobs import confinement
from jobs.launch import engine_spec
from jobs.models import Evaluation, ExportState
from monitor.models import Checkpoint
from ringside.services import engine_env, python_module

EVALUATION_TIMEOUT_S = 3600.0


class EvaluateBody(serializers.Serializer):
    tasks = serializers.CharField(required=False, allow_blank=True, default="", help_text=(
        "a JSONL task file under your data roots (a relative path is in your uploads): "
        "continuations, multiple-choice items, prompts to generate from (engine.evaluate)"))
    heldout_windows = serializers.IntegerField(required=False, default=32, min_value=0,
                                               max_value=4096,
                                               help_text="held-out windows scored per source")

    def validate(self, data: dict) -> dict:
        if data["tasks"]:
            errors: dict[str, str] = {}
            user = self.context["request"].user
            data["tasks"] = confinement.resolved(data["tasks"], user, "tasks", errors)
            if not errors and not Path(data["tasks"]).is_file():
                errors["tasks"] = "no such file under your data roots"
            if errors:
                raise serializers.ValidationError(errors)
        return data


def start(checkpoint: Checkpoint, tasks: str = "", heldout_windows: int = 32) -> Evaluation:
    """Queue a new evaluation of `checkpoint` with the task file `tasks` (a path already
    confined to the owner's data roots; empty: held-out loss only)."""
    with transaction.atomic():
        evaluation = Evaluation.objects.create(checkpoint=checkpoint, tasks=tasks,
                                               heldout_windows=heldout_windows)
        evaluation.out_dir = str(settings.RUNS_DIR / str(checkpoint.job_id) / "evaluations"
                                 / str(evaluation.pk))
        evaluation.save(update_fields=["out_dir"])
        transaction.on_commit(lambda: evaluate_checkpoint.delay(evaluation.pk))
    return evaluation


def command(evaluation: Evaluation) -> list[str]:
    """The engine's command line for `evaluation`, with the job's engine spec written into
    its folder."""
    job = evaluation.checkpoint.job
    spec_path = f"{evaluation.out_dir}/spec.json"
    with open(spec_path, "w", encoding="utf-8") as f:
        json.dump(engine_spec(job, job.spec), f)
    args = [evaluation.checkpoint.path, evaluation.out_dir, "--spec", spec_path,
            "--heldout-windows", str(evaluation.heldout_windows)]
    if evaluation.tasks:
        args += ["--tasks", evaluation.tasks]
    return python_module("engine.evaluate", *args)


@shared_task(name="jobs.evaluations.evaluate_checkpoint")
def evaluate_checkpoint(evaluation_id: int) -> str:
    """Run evaluation `evaluation_id` to its end; returns its state."""
    evaluation = Evaluation.objects.select_related("checkpoint__job").get(pk=evaluation_id)
    evaluation.record(ExportState.RUNNING)
    Path(evaluation.out_dir).mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(command(evaluation), env=engine_env(), capture_output=True,
                              text=True, timeout=EVALUATION_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        evaluation.record(ExportState.FAILED,
                          error=f"the evaluation took over {EVALUATION_TIMEOUT_S:g} s")
        return evaluation.state
    if done.returncode == 0:
        evaluation.record(ExportState.DONE, results=json.loads(done.stdout))
    else:  # engine.evaluate prints one line naming what it refused; a crash, its traceback
        message = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        evaluation.record(ExportState.FAILED, error=message[0])
    return evaluation.state
