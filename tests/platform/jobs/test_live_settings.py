"""Live settings through the API: `set` is checked by the engine's validator before it is
stored, delivered like every command and audited; the job's settings are the spec's with the
engine's acknowledged changes over them, with their history."""

import pytest

from engine.runtime.schedule import lr_at
from engine.runtime.spec import parse_spec
from jobs.models import AuditEntry, Command, Job
from monitor.models import Action, Event
from tests.platform.jobs.test_steering import control_commands
from tests.platform.jobs.test_supervisor import crash_ranks, paced_job

pytestmark = pytest.mark.django_db(transaction=True)


def test_set_is_delivered_with_the_values_as_the_engine_takes_them_and_audited(api, running):
    response = api.post(f"/api/jobs/{running.pk}/set/", {"train.lr": 1, "checkpoint.every": 20},
                        format="json")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert (body["kind"], body["state"]) == ("set", "delivered")
    assert body["args"] == {"train.lr": 1, "checkpoint.every": 20}
    assert control_commands(running) == [{"kind": "set", "id": str(body["id"]),
                                          "args": {"train.lr": 1.0, "checkpoint.every": 20}}]
    entry = AuditEntry.objects.get(action="job.set")
    assert (entry.actor, entry.details["command"]) == ("ada", body["id"])


def test_a_bad_key_or_value_answers_400_naming_it_and_nothing_is_stored(api, running):
    response = api.post(f"/api/jobs/{running.pk}/set/",
                        {"train.lr": -1, "train.steps": 10}, format="json")
    assert response.status_code == 400
    errors = response.json()
    assert errors["train.lr"] == ["must be a positive number"]
    assert errors["train.steps"][0].startswith("not a live setting; valid: ")
    assert api.post(f"/api/jobs/{running.pk}/set/", {}, format="json").status_code == 400
    assert not Command.objects.exists() and control_commands(running) == []


def test_the_settings_are_the_specs_with_the_acknowledged_changes_and_their_history(
        api, running):
    set_lr = api.post(f"/api/jobs/{running.pk}/set/", {"train.lr": 0.0005},
                      format="json").json()
    lr = parse_spec(running.spec).train.lr
    for seq, step, action, details, command in [
        (1, 6, "set", {"changes": {"train.lr": {"old": lr, "new": 0.0005}}}, str(set_lr["id"])),
        (2, 9, "rollback", {"to_step": 8, "settings": "kept"}, ""),
        (3, 12, "rollback", {"to_step": 5, "settings": "restored"}, ""),
    ]:
        Action.objects.create(job=running, seq=seq, step=step, time=0.0, action=action,
                              by="command", command=command, details=details)

    settings = api.get(f"/api/jobs/{running.pk}/settings/").json()
    assert settings["effective"]["train.lr"] == lr  # the rollback to step 5 took it back
    assert settings["effective"]["checkpoint.every"] == running.spec["checkpoint"]["every"]
    assert settings["history"] == [
        {"step": 6, "changes": {"train.lr": {"old": lr, "new": 0.0005}}, "by": "ada"},
        {"step": 12, "changes": {"train.lr": {"old": 0.0005, "new": lr}}, "by": "rollback"},
    ]
def test_set_needs_a_running_job(api, user, small_spec):
    queued = Job.objects.create(name="q", owner=user, spec=small_spec)
    response = api.post(f"/api/jobs/{queued.pk}/set/", {"train.lr": 0.001}, format="json")
    assert response.status_code == 409




def test_a_set_holds_after_a_crash_restarts_the_ranks_from_before_it(
        api, celery_worker, small_spec, eventually):
    job_id = paced_job(api, small_spec, eventually, celery_worker, procs=1)  # no checkpoints
    change = api.post(f"/api/jobs/{job_id}/set/", {"train.lr": 0.0042}, format="json").json()
    eventually(lambda: Command.objects.get(pk=change["id"]).state == "done", 60, "not applied")
    crash_ranks(job_id)
    again = "live settings set after the checkpoint applied again: train.lr=0.0042"

    def applied_again() -> list[Event]:
        return [e for e in Event.objects.filter(job_id=job_id, type="log")
                if e.data["message"] == again]
    eventually(applied_again, 120,
               f"the restart did not apply the set again; worker log: {celery_worker.log_path}")
    restarted = applied_again()[0].seq
    eventually(lambda: Event.objects.filter(job_id=job_id, type="step", seq__gt=restarted)
               .count() >= 2, 60, "no step after the restart")
    train = parse_spec({**Job.objects.get(pk=job_id).spec, "train": {
        **Job.objects.get(pk=job_id).spec["train"], "lr": 0.0042}}).train
    steps = Event.objects.filter(job_id=job_id, type="step", seq__gt=restarted)
    assert [e.data["lr"] for e in steps] == pytest.approx([lr_at(e.step, train) for e in steps])
    assert api.get(f"/api/jobs/{job_id}/settings/").json()["effective"]["train.lr"] == 0.0042
    assert api.post(f"/api/jobs/{job_id}/cancel/", {}, format="json").status_code == 202
