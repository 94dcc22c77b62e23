"""A job's live settings: the values in force (the spec's, with the `set` commands the engine
carried out over them) and how they came to be, replayed from the stored action events."""

from __future__ import annotations

from engine.runtime.settings import launched_values
from engine.runtime.spec import parse_spec
from jobs.models import CommandKind, Job
from monitor.models import Action


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
    for row in Action.objects.filter(job=job, action__in=("set", "rollback")).order_by("seq"):
        if row.action == "set":
            entry = {"step": row.step, "changes": row.details.get("changes", {}),
                     "by": by.get(row.command, row.by)}
            in_force.append(entry)
        elif row.details.get("settings") == "restored":
            to_step = int(row.details.get("to_step", 0))
            in_force = [e for e in in_force if e["step"] < to_step]
            entry = {"step": row.step, "changes": {}, "by": "rollback"}
        else:
            continue
        now = {**launched, **{k: c["new"] for e in in_force for k, c in e["changes"].items()}}
        if entry["by"] == "rollback":
            entry["changes"] = {k: {"old": effective[k], "new": v} for k, v in now.items()
                                if v != effective[k]}
        effective = now
        history.append(entry)
    return {"effective": effective, "history": history}
