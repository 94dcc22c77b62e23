"""A job's history as the engine's stored `action` events tell it (read through
jobs.telemetry): the live settings in force over time (`set` commands, and the rollbacks that
restored a checkpoint's), and which of its checkpoints a rollback abandoned."""

from __future__ import annotations

from engine.contract import ActionName, CommandKind
from engine.runtime.spec import launched_values, parse_spec
from jobs.models import Checkpoint, Job
from jobs.telemetry import telemetry

LIVE = "live"
ABANDONED = "abandoned"


def settings_history(job: Job) -> dict:
    """Replays the job's `set` actions over its spec. A rollback that restored a checkpoint's
    settings drops the changes made at or after that checkpoint's step (a checkpoint is saved
    before the step's commands are carried out) and enters the history as "rollback"."""
    launched = launched_values(parse_spec(job.spec))
    by = {str(pk): user for pk, user in
          job.commands.filter(kind=CommandKind.SET).values_list("pk", "requested_by")}
    history: list[dict] = []
    in_force: list[dict] = []  # the set entries in force, oldest first
    effective = launched
    for row in telemetry().actions(job.pk, (ActionName.SET, ActionName.ROLLBACK)):
        details = row["details"]
        if row["action"] == ActionName.SET:
            entry = {"step": row["step"], "changes": details.get("changes", {}),
                     "by": by.get(row["command"], row["by"])}
            in_force.append(entry)
        elif details.get("settings") == "restored":
            to_step = int(details.get("to_step", 0))
            in_force = [e for e in in_force if e["step"] < to_step]
            entry = {"step": row["step"], "changes": {}, "by": "rollback"}
        else:
            continue
        now = {**launched, **{k: c["new"] for e in in_force for k, c in e["changes"].items()}}
        if entry["by"] == "rollback":
            entry["changes"] = {k: {"old": effective[k], "new": v} for k, v in now.items()
                                if v != effective[k]}
        effective = now
        history.append(entry)
    return {"effective": effective, "history": history}


def rollbacks(job_id: int) -> list[tuple[int, int]]:
    """(seq, to_step) of each rollback the engine carried out for the job."""
    return [(row["seq"], row["details"]["to_step"])
            for row in telemetry().actions(job_id, (ActionName.ROLLBACK,))
            if "to_step" in row["details"]]


def branch(checkpoint: Checkpoint, job_rollbacks: list[tuple[int, int]]) -> str:
    """ABANDONED when a later rollback (by event seq) went back to before the checkpoint's
    step: training went on from an older state, and the steps it saved were trained again;
    else LIVE."""
    abandoned = any(seq > checkpoint.seq and to_step < checkpoint.step
                    for seq, to_step in job_rollbacks)
    return ABANDONED if abandoned else LIVE
