"""Evaluating a job's checkpoint, never in the web process, on the slots training leaves.

`start` records an `Evaluation` and queues `evaluate_checkpoint`. The Celery task runs
`python -m engine.evaluate` in child processes (torch's memory goes back when they exit) on
the job's engine spec (reading only under its owner's data roots, the task file included)
into `<RUNS_DIR>/<job id>/evaluations/<evaluation id>/`. The work is the engine's numbered
items, cut into chunks of CHUNK_ITEMS; each slot is one child scoring one chunk. Elastic, at a
lower priority than training: it holds no reservation, so placement never waits for it, and
it runs as many slots as its `slots` and `training_free_slots()` allow, checked every
POLL_S. When that number falls (a training job queued, or placed), the newest slots are
stopped and their chunks go back to the front of the queue: the engine keeps a record per
scored item, so a chunk started again scores only what is left, and every item is scored
exactly once. When no chunk is left the engine's summary is recorded (done), or the first
failure's message (failed). Its progress (items done of all) is on its row and pushed to the
job's page as it grows, and its results, once done, go to the job's sinks
(monitor.sinks.evaluations).

A job whose spec says `eval.on_checkpoint` has each of its disk checkpoints evaluated, with
the spec's `eval` options, as its supervisor ingests the checkpoint's event: once per
checkpoint (a unique constraint), however often the event is read.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.db import IntegrityError, transaction
from rest_framework import serializers

from common.services import engine_env, python_module
from engine import contract
from engine.runtime.spec import BOUNDS, EvalSpec
from hosts.models import Host
from jobs import confinement
from jobs.launch import engine_spec
from jobs.models import Checkpoint, Evaluation, ExportState, Job
from jobs.placement import free_slots, queue, shape
from jobs.telemetry import telemetry

EVALUATION_TIMEOUT_S = 3600.0
CHUNK_ITEMS = 8
MAX_SLOTS = BOUNDS["eval.slots"]
POLL_S = 0.2


class EvaluationFailed(Exception):
    """A slot's engine process failed; the message is its last line of error output."""


class EvaluateBody(serializers.Serializer):
    tasks = serializers.CharField(required=False, allow_blank=True, default="", help_text=(
        "a JSONL task file under your data roots (a relative path is in your uploads): "
        "continuations, multiple-choice items, prompts to generate from (engine.evaluate)"))
    heldout_windows = serializers.IntegerField(required=False, default=EvalSpec.heldout_windows,
                                               min_value=0,
                                               max_value=BOUNDS["eval.heldout_windows"],
                                               help_text="held-out windows scored per source")
    slots = serializers.IntegerField(required=False, default=1, min_value=1,
                                     max_value=MAX_SLOTS, help_text=(
                                         "the most slots it uses at once, of those no training "
                                         "job holds or waits for"))

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


def start(checkpoint: Checkpoint, tasks: str = "", heldout_windows: int = 32,
          slots: int = 1, automatic: bool = False) -> Evaluation:
    """Queue a new evaluation of `checkpoint` with the task file `tasks` (a path already
    confined to the owner's data roots; empty: held-out loss only). IntegrityError if
    `automatic` and the checkpoint has its automatic one already."""
    with transaction.atomic():
        evaluation = Evaluation.objects.create(checkpoint=checkpoint, tasks=tasks,
                                               heldout_windows=heldout_windows, slots=slots,
                                               automatic=automatic)
        evaluation.out_dir = str(settings.RUNS_DIR / str(checkpoint.job_id) / "evaluations"
                                 / str(evaluation.pk))
        evaluation.save(update_fields=["out_dir"])
        transaction.on_commit(lambda: evaluate_checkpoint.delay(evaluation.pk))
    return evaluation


def on_checkpoint(job: Job, event: contract.CheckpointEvent) -> Evaluation | None:
    """The automatic evaluation of the checkpoint of `event`, queued if the job's spec asks
    for it (`eval.on_checkpoint`, a disk checkpoint) and not queued before; else None."""
    options = job.spec.get("eval", {})
    if event.tier != contract.CheckpointTier.DISK or not options.get("on_checkpoint"):
        return None
    checkpoint = Checkpoint.objects.filter(job=job, seq=event.seq).first()
    if checkpoint is None:
        return None
    try:
        return start(checkpoint, options["tasks"], options["heldout_windows"], options["slots"],
                     automatic=True)
    except IntegrityError:  # its event was read again (a redelivery, a second ingest)
        return None


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


def training_free_slots() -> int:
    """The slots of the up hosts that no reservation holds, less those the queued training
    jobs ask for: what an evaluation may use without keeping training waiting."""
    hosts = list(Host.objects.up())
    free = sum(len(slots) for slots in free_slots(hosts).values())
    wanted = sum(need.slots * need.most for need in map(shape, queue()))
    return max(0, free - wanted)


@dataclass
class Slot:
    """One child process scoring one chunk of items."""

    process: subprocess.Popen
    items: range
    log: Path


def _summary(engine: list[str]) -> dict:
    """The engine's summary of what the folder holds, scoring nothing (an empty range)."""
    done = subprocess.run([*engine, "--items", "0:0"], env=engine_env(), capture_output=True,
                          text=True, timeout=EVALUATION_TIMEOUT_S)
    if done.returncode != 0:
        raise EvaluationFailed(_last_line(done.stderr, done.returncode))
    return json.loads(done.stdout)


def _last_line(stderr: str, returncode: int) -> str:
    # engine.evaluate prints one line naming what it refused; a crash, its traceback
    return (stderr.strip().splitlines()[-1:] or [f"exit code {returncode}"])[0]


def _launch(engine: list[str], items: range, out_dir: Path) -> Slot:
    log = out_dir / f"slot-{items.start}-{items.stop}.log"
    with log.open("w") as errors:
        process = subprocess.Popen([*engine, "--items", f"{items.start}:{items.stop}"],
                                   env=engine_env(), stdout=subprocess.DEVNULL, stderr=errors)
    return Slot(process, items, log)


def run_slots(evaluation: Evaluation, free: Callable[[], int]) -> dict:
    """Score every item of `evaluation` on at most `evaluation.slots` slots, and at each poll
    on no more than `free()` of them (module docstring); the engine's summary."""
    engine, out_dir = command(evaluation), Path(evaluation.out_dir)
    total = _summary(engine)["items_total"]
    chunks = deque(range(a, min(a + CHUNK_ITEMS, total)) for a in range(0, total, CHUNK_ITEMS))
    running: list[Slot] = []
    try:
        while chunks or running:
            allowed = min(evaluation.slots, free())
            while len(running) > allowed:  # yield the newest to training; its chunk waits
                slot = running.pop()
                slot.process.terminate()
                slot.process.wait()
                chunks.appendleft(slot.items)
            while len(running) < allowed and chunks:
                running.append(_launch(engine, chunks.popleft(), out_dir))
            for slot in [s for s in running if s.process.poll() is not None]:
                running.remove(slot)
                if slot.process.returncode != 0:
                    raise EvaluationFailed(_last_line(slot.log.read_text(),
                                                      slot.process.returncode))
            progress(evaluation, _items_done(out_dir), total)
            time.sleep(POLL_S)
    finally:
        for slot in running:
            slot.process.kill()
            slot.process.wait()
    return _written_results(out_dir) or _summary(engine)


def _written_results(out_dir: Path) -> dict | None:
    """The summary the engine wrote once every item was scored, if one was. Each slot reads the
    records after writing its own, so the last slot to read sees every item and writes it; an
    evaluation with nothing left to score ran no slot and asks the engine."""
    try:
        return json.loads((out_dir / contract.EVALUATION_RESULTS).read_text())
    except FileNotFoundError:
        return None


def _items_done(out_dir: Path) -> int:
    # the engine's per-item records: one line each, written whole (engine.evaluate)
    return sum(p.read_bytes().count(b"\n") for p in out_dir.glob("items-*.jsonl"))


def progress(evaluation: Evaluation, done: int, total: int) -> None:
    """Record `done` of `total` items on the evaluation's row and push it, if it moved."""
    if (evaluation.items_done, evaluation.items_total) == (done, total):
        return
    evaluation.items_done, evaluation.items_total = done, total
    Evaluation.objects.filter(pk=evaluation.pk).update(items_done=done, items_total=total)
    push(evaluation)


def push(evaluation: Evaluation) -> None:
    """The evaluation's state and progress to its job's page (an `evaluation` message on the
    job's socket; `seq`, as every message there: the newest event the page may hold)."""
    job_id = evaluation.checkpoint.job_id
    telemetry().push(job_id, {"type": "evaluation", "evaluation": {
        "id": evaluation.pk, "checkpoint": evaluation.checkpoint_id,
        "step": evaluation.checkpoint.step, "state": evaluation.state,
        "items_done": evaluation.items_done, "items_total": evaluation.items_total,
        "progress": evaluation.progress}})


@shared_task(name="jobs.evaluations.evaluate_checkpoint")
def evaluate_checkpoint(evaluation_id: int) -> str:
    """Run evaluation `evaluation_id` to its end; returns its state."""
    evaluation = Evaluation.objects.select_related("checkpoint__job").get(pk=evaluation_id)
    evaluation.record(ExportState.RUNNING)
    push(evaluation)
    Path(evaluation.out_dir).mkdir(parents=True, exist_ok=True)
    try:
        results = run_slots(evaluation, training_free_slots)
    except (EvaluationFailed, subprocess.TimeoutExpired) as e:
        evaluation.record(ExportState.FAILED, error=str(e))
    else:
        evaluation.record(ExportState.DONE, results=results)
        telemetry().publish_evaluation(evaluation)
    push(evaluation)
    return evaluation.state
