"""Approved actions through the platform: a proposal of the engine's fault policy is listed,
fires the job's webhook, is answered through the API (audited with who answered) or times out
in the engine (audited as the engine's); a decision on a proposal that moved on is a 409 that
says why, and a bad policy or body is refused naming the field with nothing changed."""

import pytest

from engine.contract import ProposalEvent
from jobs.models import AuditEntry, Command, Job, State
from monitor.ingest import store_events
from monitor.models import Action
from tests.platform.jobs.receiver import subscribe
from tests.platform.jobs.test_steering import control_commands

pytestmark = pytest.mark.django_db(transaction=True)

PENDING = {"type": "proposal", "step": 8, "time": 1.0, "seq": 1, "id": "p-8-1",
           "status": "pending", "action": "rollback", "anomaly": "loss_spike",
           "deadline": 2e9, "default": "rollback", "hold": True, "evidence": {"z": 9.0}}


def decide(api, job_id: int, pid: str, **body):
    return api.post(f"/api/jobs/{job_id}/proposals/{pid}/decide/", body, format="json")


@pytest.mark.parametrize(("body", "field", "message"), [
    ({}, "choice", "required"),
    ({"choice": "maybe"}, "choice", "not a valid choice"),
    ({"choice": "choose"}, "action", "needed with choice choose"),
    ({"choice": "approve", "action": "pause"}, "action", "only with it"),
    ({"choice": "choose", "action": "reboot"}, "action", "not a valid choice"),
])
def test_a_bad_decision_is_refused_naming_the_field_and_nothing_is_sent(api, running, body,
                                                                        field, message):
    store_events(running.pk, [PENDING])
    response = decide(api, running.pk, "p-8-1", **body)
    assert response.status_code == 400
    assert message in str(response.json()[field])
    assert control_commands(running) == [] and not Command.objects.filter(job=running).exists()


def test_a_decision_reaches_the_engine_as_a_decide_command_and_is_audited(api, running):
    store_events(running.pk, [PENDING])
    listed = api.get(f"/api/jobs/{running.pk}/proposals/").json()["results"]
    assert [(p["id"], p["status"], p["evidence"]) for p in listed] == [
        ("p-8-1", "pending", {"z": 9.0})]
    response = decide(api, running.pk, "p-8-1", choice="choose", action="lr_cut")
    assert response.status_code == 202, response.json()
    assert control_commands(running)[-1]["args"] == {"proposal": "p-8-1", "choice": "choose",
                                                      "action": "lr_cut"}
    entry = AuditEntry.objects.get(action="job.decide")
    assert (entry.actor, entry.details["args"]["proposal"]) == ("ada", "p-8-1")
    assert decide(api, running.pk, "p-9-9", choice="approve").status_code == 404


def test_the_api_refuses_a_bad_approval_policy_naming_the_field_and_creates_nothing(
        api, small_spec):
    small_spec["faults"] = {"policy": {"approve": ["rollback", "reboot"],
                                       "approve_timeout_s": -5}}
    response = api.post("/api/jobs/", small_spec, format="json")
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert "unknown action 'reboot'" in errors["faults.policy.approve.1"]
    assert errors["faults.policy.approve_timeout_s"] == "must be a positive number of seconds"
    assert not Job.objects.exists()


def proposals_of(job_id: int, status: str) -> list[dict]:
    return [e for e in store_of(job_id) if e["status"] == status]


def store_of(job_id: int) -> list[dict]:
    from monitor.models import Event

    return list(Event.objects.filter(job_id=job_id, type=ProposalEvent.type).order_by("seq")
                .values_list("data", flat=True))


def spiked(api, small_spec: dict, name: str, **policy) -> int:
    """A nano job on one rank, through the API, whose loss spikes at step 8 and whose policy
    answers a spike with a rollback that a person must approve."""
    small_spec.update(name=name, checkpoint={"every": 5})
    small_spec["train"]["steps"] = 16
    small_spec["faults"] = {
        "policy": {"actions": {"loss_spike": ["rollback"]}, "approve": ["rollback"], **policy},
        "inject": [{"kind": "loss_spike", "step": 8, "factor": 20}]}
    return api.post("/api/jobs/", small_spec, format="json").json()["id"]


def test_a_spike_is_proposed_with_a_webhook_and_approving_it_rolls_back(
        api, celery_worker, small_spec, eventually, receiver):
    job_id = spiked(api, small_spec, "approve", approve_timeout_s=120)
    subscribe(api, receiver, "/job", job=job_id)
    eventually(lambda: proposals_of(job_id, "pending"), 120,
               f"no proposal; worker log: {celery_worker.log_path}")
    proposal = proposals_of(job_id, "pending")[0]
    assert (proposal["action"], proposal["step"], proposal["hold"]) == ("rollback", 8, True)
    eventually(lambda: any(d["event"] == "proposal" for d in receiver.deliveries), 10,
               "no webhook for the proposal")
    delivery = next(d for d in receiver.deliveries if d["event"] == "proposal")
    assert delivery["verified"] and delivery["body"]["data"]["id"] == proposal["id"]

    assert decide(api, job_id, proposal["id"], choice="approve").status_code == 202
    eventually(lambda: Job.objects.get(pk=job_id).state == State.COMPLETED, 60,
               f"the run did not complete; worker log: {celery_worker.log_path}")
    decided = proposals_of(job_id, "approved")[0]
    assert (decided["take"], decided["by"]) == ("rollback", f"command {decided['command']}")
    rollback = Action.objects.get(job_id=job_id, action="rollback")
    assert (rollback.details["from_step"], rollback.details["to_step"]) == (8, 5)
    assert Command.objects.get(pk=int(decided["command"])).state == "done"
    assert AuditEntry.objects.get(job_id=job_id, action="job.decide").actor == "ada"

    late = decide(api, job_id, proposal["id"], choice="dismiss")
    assert late.status_code == 409
    assert late.json()["detail"] == (f"proposal {proposal['id']} is no longer pending: approved "
                                     f"by command {decided['command']} at step 8 (took rollback)")


def test_a_proposal_nobody_answers_takes_the_policys_default_audited_as_the_engines(
        api, celery_worker, small_spec, eventually):
    job_id = spiked(api, small_spec, "unanswered", approve_timeout_s=1,
                    approve_default="skip_update")
    eventually(lambda: Job.objects.get(pk=job_id).state == State.COMPLETED, 120,
               f"the run did not complete; worker log: {celery_worker.log_path}")
    (timed_out,) = proposals_of(job_id, "timed_out")
    assert (timed_out["take"], timed_out["by"], timed_out["default"]) == (
        "skip_update", "timeout", "skip_update")
    assert Action.objects.filter(job_id=job_id, action="skip_update").exists()
    assert not Action.objects.filter(job_id=job_id, action="rollback").exists()
    entry = AuditEntry.objects.get(job_id=job_id, action="proposal.timeout")
    assert (entry.actor, entry.cause, entry.details["take"]) == ("engine", "engine",
                                                                 "skip_update")
    assert decide(api, job_id, timed_out["id"], choice="approve").status_code == 409
