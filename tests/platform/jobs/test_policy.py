"""The platform's fault policy on a real run: the hourly limit on the engine's own actions
pauses the job for a person, and counts only the actions since the job last resumed."""

import pytest

from jobs.models import Cause, Job, State
from monitor.models import Action
from tests.policies import paced

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 12
LATE_CRASH = 10  # well after the pause the first two crashes bring


def test_the_auto_action_limit_counts_only_the_actions_since_the_last_resume(
        api, celery_worker, small_spec, eventually):
    small_spec["train"]["steps"] = STEPS
    faults = paced(1, factor=5)
    # each crash restarts the ranks: an action of the engine's fault policy
    faults["inject"] += [{"kind": "crash", "step": step, "rank": 0}
                         for step in (3, 5, LATE_CRASH)]
    small_spec["faults"] = faults
    created = api.post("/api/jobs/", {**small_spec, "platform": {"max_auto_actions_per_hour": 2}},
                       format="json")
    assert created.status_code == 201, created.json()
    job_id = created.json()["id"]
    eventually(lambda: Job.objects.get(pk=job_id).state == State.PAUSED, 240,
               f"the limit did not pause the job; worker log: {celery_worker.log_path}")
    job = Job.objects.get(pk=job_id)
    pausing = job.transitions.get(to_state=State.PAUSING)
    assert pausing.cause == Cause.POLICY
    assert job.step < LATE_CRASH, job.step

    assert api.post(f"/api/jobs/{job_id}/resume/", {}, format="json").status_code == 202
    eventually(lambda: Job.objects.get(pk=job_id).is_terminal, 240,
               f"the resumed job did not finish; worker log: {celery_worker.log_path}")
    job.refresh_from_db()
    # the late crash is one action since the resume, under the limit: not paused again
    assert job.state == State.COMPLETED, job.error
    assert Action.objects.filter(job=job, action="restart", by="policy").count() == 3
    assert list(job.transitions.values_list("to_state", flat=True)).count("pausing") == 1
