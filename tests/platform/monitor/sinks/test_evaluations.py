"""A finished evaluation's results reach every sink of its job at the checkpoint's step,
through the job's event stream: TensorBoard's own reader and a real MLflow server read them
back, a server that was down gets them once it is back, and the engine's next event still
follows the evaluation's in the stream. A task name the user chose cannot break a tracker."""

import pytest

from engine.runtime.events import EventLog
from jobs.models import Checkpoint, Evaluation, ExportState
from monitor.ingest import StreamIngest
from monitor.sinks import evaluations
from monitor.sinks.models import Sink, SinkKind, SinkState
from monitor.sinks.records import NAME_PART_CHARS
from tests.platform.monitor.sinks.conftest import history, publish_run, write_all
from tests.platform.monitor.sinks.test_tensorboard import read_back

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = "acc#1 </script> ü" + "x" * 300  # a task name from the user's task file
RESULTS = {"items_done": 5, "items_total": 5,
           "heldout": {"web": {"loss": 2.5, "perplexity": 12.18, "windows": 2}},
           "tasks": {"letters": {"kind": "choice", "items": 4, "accuracy": 0.75},
                     HOSTILE: {"kind": "continuation", "items": 1, "exact_match": 1.0,
                               "loglik": -3.5}}}
HOSTILE_SERIES = "eval/tasks/" + ("acc_1___script___" + "x" * 300)[:NAME_PART_CHARS]


@pytest.fixture(autouse=True)
def catch_ups(monkeypatch) -> list[int]:
    """The sinks `publish` hands to the `catch_up` task, kept here: each test's own consumer
    reads them instead (a Celery worker of another test in this process would take the
    events from the sink's consumer group first)."""
    sent: list[int] = []
    monkeypatch.setattr(evaluations.catch_up, "delay", sent.append)
    return sent


def finished_evaluation(job) -> Evaluation:
    """A done evaluation of the job's disk checkpoint at step 4 (publish_run's)."""
    checkpoint = Checkpoint.objects.create(job=job, seq=7, step=4, time=0.0, tier="disk",
                                           path=f"/runs/{job.pk}/checkpoints/step-4")
    evaluation = Evaluation.objects.create(checkpoint=checkpoint, out_dir="/unused")
    evaluation.record(ExportState.DONE, results=RESULTS)
    return evaluation


def test_the_results_are_tensorboard_scalars_at_the_checkpoints_step(job, bus,
                                                                     platform_redis_url):
    publish_run(job, platform_redis_url)
    wire = evaluations.publish(finished_evaluation(job))
    assert (wire["type"], wire["step"], wire["seq"]) == ("evaluation", 4, 9)
    sink = Sink.objects.create(job=job, kind=SinkKind.TENSORBOARD)
    write_all(sink, bus).close(SinkState.CLOSED)

    files = read_back(job)
    expected = {"eval/heldout/web/loss": 2.5, "eval/heldout/web/perplexity": 12.18,
                "eval/heldout/web/windows": 2.0, "eval/tasks/letters/accuracy": 0.75,
                "eval/tasks/letters/items": 4.0, f"{HOSTILE_SERIES}/exact_match": 1.0,
                f"{HOSTILE_SERIES}/loglik": -3.5}
    for name, value in expected.items():
        assert [(e.step, pytest.approx(e.value)) for e in files.Scalars(name)] == [(4, value)]
    assert not [tag for tag in files.Tags()["scalars"] if tag.endswith("/kind")]


def test_the_engines_next_event_follows_the_evaluations_and_the_ingest_takes_both(
        job, bus, platform_redis_url):
    publish_run(job, platform_redis_url, steps=range(1, 5))
    evaluations.publish(finished_evaluation(job))
    log = EventLog(str(job.pk), bus_url=platform_redis_url)  # the engine, relaunched
    log.emit_wire("log", 4, level="info", message="resumed")
    log.close()

    ids = [entry_id for entry_id, _ in bus.xrange(f"ringside:job:{job.pk}:events")]
    assert ids[-2:] == [b"7-1", b"8-0"]  # seq 7: the checkpoint, step 4
    parsed = StreamIngest(job.pk, bus, consumer="ingest").drain()
    assert [e.type for e in parsed][-2:] == ["evaluation", "log"]


def test_mlflow_gets_the_results_once_its_server_is_back(job, bus, platform_redis_url,
                                                         server, mlflow_sink, monkeypatch,
                                                         catch_ups):
    publish_run(job, platform_redis_url)
    consumer = write_all(mlflow_sink, bus)
    server.freeze()
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    evaluations.publish(finished_evaluation(job))
    assert catch_ups == [mlflow_sink.pk]  # no supervisor reads a queued job's sinks
    try:
        with pytest.raises(Exception, match="timed out"):
            consumer.poll()
    finally:
        server.thaw()
    monkeypatch.undo()
    while consumer.poll():
        pass

    mlflow_sink.refresh_from_db()
    assert history(server, mlflow_sink.run_id, "eval/heldout/web/perplexity") == [
        (4, pytest.approx(12.18))]
    assert history(server, mlflow_sink.run_id, "eval/tasks/letters/accuracy") == [
        (4, pytest.approx(0.75))]
    assert history(server, mlflow_sink.run_id, f"{HOSTILE_SERIES}/exact_match") == [(4, 1.0)]
    assert (mlflow_sink.state, mlflow_sink.last_error) == (SinkState.WRITING, "")
