"""The W&B sink offline (no network): run files for `wandb sync`, one run id across launches,
and a checkpoint's scores kept though they arrive after later training steps."""

import pytest

from jobs.launch import run_dir
from monitor.sinks import evaluations
from monitor.sinks.consumer import SinkConsumer
from monitor.sinks.models import Sink, SinkKind, SinkState
from tests.platform.monitor.sinks.conftest import publish_run, write_all
from tests.platform.monitor.sinks.test_evaluations import finished_evaluation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def offline_runs(job) -> list[str]:
    return sorted(p.name for p in (run_dir(job) / "wandb").glob("offline-run-*"))


def run_file(job, folder: str, run_id: str):
    # the folder is named by the second its launch started (a second launch within the same
    # second gets a `-1` suffix): the run's id is in its file's name
    return run_dir(job) / "wandb" / folder / f"run-{run_id}.wandb"


def test_offline_run_files_are_written_and_a_relaunch_continues_the_same_run(
        job, bus, platform_redis_url):
    sink = Sink.objects.create(job=job, kind=SinkKind.WANDB,
                               config={"kind": "wandb", "mode": "offline", "project": "moe"})
    publish_run(job, platform_redis_url, steps=range(1, 4))
    write_all(sink, bus).close()
    sink.refresh_from_db()
    run_id = sink.run_id
    (first,) = offline_runs(job)
    assert run_file(job, first, run_id).stat().st_size > 0

    # the job's next launch (a resume): a new consumer of the same sink
    publish_run(job, platform_redis_url, steps=range(4, 7))
    write_all(Sink.objects.get(pk=sink.pk), bus).close()
    runs = offline_runs(job)
    assert len(runs) == 2 and all(run_file(job, name, run_id).exists() for name in runs)
    assert Sink.objects.get(pk=sink.pk).run_id == run_id


def test_online_without_an_api_key_says_what_to_set(job, bus, platform_redis_url):
    sink = Sink.objects.create(job=job, kind=SinkKind.WANDB,
                               config={"kind": "wandb", "mode": "online", "project": "moe"})
    publish_run(job, platform_redis_url, steps=[1])
    with pytest.raises(Exception, match="no W&B API key"):
        SinkConsumer(sink, bus).poll()
    sink.refresh_from_db()
    assert sink.state == SinkState.FAILING
    assert "PUT /api/me/secrets/wandb_api_key/" in sink.last_error


def test_a_checkpoints_evaluation_is_kept_at_its_step_after_later_training_steps(
        job, bus, platform_redis_url):
    sink = Sink.objects.create(job=job, kind=SinkKind.WANDB,
                               config={"kind": "wandb", "mode": "offline", "project": "moe"})
    publish_run(job, platform_redis_url)  # steps 1-6, the checkpoint at step 4
    evaluations.publish(finished_evaluation(job))
    publish_run(job, platform_redis_url, steps=[7])  # training went on: step 6's row is done
    consumer = write_all(sink, bus)

    summary = consumer.tracker.run.summary  # the finished rows, from W&B's own service
    assert summary["eval/heldout/web/perplexity"] == pytest.approx(12.18)
    assert summary["eval/tasks/letters/accuracy"] == pytest.approx(0.75)
    assert (summary["checkpoint_step"], summary["_step"]) == (4, 6)
    assert summary["loss"] == pytest.approx(1.0)  # step 6's: no training row was lost
    consumer.close()
