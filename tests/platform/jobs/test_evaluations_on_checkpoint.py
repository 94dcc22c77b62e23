"""`eval.on_checkpoint` in a job's spec: each of its disk checkpoints is evaluated once, with
the spec's `eval` options, as its event is ingested; bad options are field errors, and a task
file outside the owner's data roots is refused. While an evaluation runs, its progress is
pushed to the job's page and is in the API."""

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from engine import contract
from jobs import evaluations
from jobs.confinement import uploads_dir
from jobs.models import Checkpoint, Evaluation, Job, State
from monitor.ingest import job_group
from tests.platform.jobs.test_evaluations import TASKS, evaluate_url, shared_trained_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


def test_bad_eval_options_are_field_errors(api, user, other_user, small_spec):
    theirs = uploads_dir(other_user) / "tasks.jsonl"
    theirs.parent.mkdir(parents=True, exist_ok=True)
    theirs.write_text(json.dumps(TASKS[0]) + "\n")
    refused = api.post("/api/jobs/", {**small_spec, "eval": {
        "on_checkpoint": "yes", "slots": 9, "heldout_windows": -1, "tasks": str(theirs),
        "every": 2}}, format="json")

    assert refused.status_code == 400
    assert set(refused.json()["errors"]) == {"eval.on_checkpoint", "eval.slots",
                                             "eval.heldout_windows", "eval.tasks",
                                             "eval.every"}
    assert not Job.objects.exists()


@pytest.mark.django_db  # in a transaction never committed: what it queues is only captured
def test_a_checkpoints_event_read_twice_queues_one_evaluation(user, small_spec, tmp_path,
                                                              django_capture_on_commit_callbacks):
    spec = {**small_spec, "eval": {"on_checkpoint": True, "tasks": "", "heldout_windows": 2,
                                   "slots": 2}}
    job = Job.objects.create(name="t", owner=user, spec=spec)
    Checkpoint.objects.create(job=job, seq=5, step=2, time=0.0, tier="disk", path=str(tmp_path))
    Checkpoint.objects.create(job=job, seq=6, step=2, time=0.0, tier="memory",
                              path=str(tmp_path))
    disk = contract.CheckpointEvent(step=2, seq=5, path=str(tmp_path), tier="disk",
                                    blocking_s=0.0, size_bytes=1, strategy="NNN", world_size=1)
    memory = contract.CheckpointEvent(step=2, seq=6, path=str(tmp_path), tier="memory",
                                      blocking_s=0.0, size_bytes=1, strategy="NNN", world_size=1)

    with django_capture_on_commit_callbacks() as queued:
        first = evaluations.on_checkpoint(job, disk)
        assert evaluations.on_checkpoint(job, disk) is None
        assert evaluations.on_checkpoint(job, memory) is None
    assert len(queued) == 1
    assert (first.automatic, first.heldout_windows, first.slots) == (True, 2, 2)
    assert list(Evaluation.objects.values_list("pk", flat=True)) == [first.pk]


def test_a_job_with_on_checkpoint_ends_with_one_finished_evaluation_per_disk_checkpoint(
        api, user, celery_worker, small_spec, eventually):
    # two disk checkpoints, each evaluated by three engine processes (a summary, a chunk of
    # items and the closing summary): two show "one per checkpoint" as well as more would
    small_spec["train"]["steps"] = 4
    spec = {**small_spec, "checkpoint": {"every": 2},
            "eval": {"on_checkpoint": True, "heldout_windows": 2}}
    job_id = api.post("/api/jobs/", spec, format="json").json()["id"]
    eventually(lambda: Job.objects.get(pk=job_id).state == State.COMPLETED, 180,
               f"job {job_id} did not complete; worker log: {celery_worker.log_path}")
    disk = Checkpoint.objects.filter(job_id=job_id, tier="disk")
    assert sorted(disk.values_list("step", flat=True)) == [2, 4]

    def all_finished() -> bool:
        return (Evaluation.objects.filter(checkpoint__job_id=job_id, state="done").count()
                == disk.count())

    eventually(all_finished, 300, f"the evaluations did not finish; worker log: "
                                  f"{celery_worker.log_path}")
    for checkpoint in disk:
        (evaluation,) = api.get(evaluate_url(job_id, checkpoint.pk)).json()["results"]
        assert evaluation["automatic"] and evaluation["progress"] == 1.0
        (heldout,) = evaluation["results"]["heldout"].values()
        assert heldout["windows"] == 2


async def _pushed(channel: str) -> list[dict]:
    """What the channel got until it stayed quiet for a second."""
    layer, messages = get_channel_layer(), []
    while True:
        try:
            message = await asyncio.wait_for(layer.receive(channel), 1.0)
        except TimeoutError:
            return messages
        messages += message["events"]


def test_progress_is_pushed_to_the_job_page_and_in_the_api(api, user, tmp_path,
                                                             tmp_path_factory, monkeypatch):
    # two chunks on one slot: the count moves between them (the 3 of the first is pushed)
    monkeypatch.setattr(evaluations, "CHUNK_ITEMS", 3)
    monkeypatch.setattr(evaluations, "training_free_slots", lambda: 1)
    job, checkpoint = shared_trained_checkpoint(user, tmp_path_factory)
    evaluation = Evaluation.objects.create(checkpoint=checkpoint, heldout_windows=6,
                                           out_dir=str(tmp_path / "evaluation"))
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(job_group(job.pk), channel)

    assert evaluations.evaluate_checkpoint(evaluation.pk) == "done"  # here, not queued

    pushed = [m for m in async_to_sync(_pushed)(channel) if m["type"] == "evaluation"]
    states = [m["evaluation"]["state"] for m in pushed]
    assert states[0] == "running" and states[-1] == "done"
    done = [m["evaluation"]["items_done"] for m in pushed if m["evaluation"]["items_total"]]
    assert done == sorted(done) and done[-1] == 6 and len(set(done)) > 1  # it moved
    assert {m["evaluation"]["id"] for m in pushed} == {evaluation.pk}
    assert pushed[-1]["evaluation"]["progress"] == 1.0
    (listed,) = api.get(evaluate_url(job.pk, checkpoint.pk)).json()["results"]
    assert (listed["items_done"], listed["items_total"], listed["progress"]) == (6, 6, 1.0)
