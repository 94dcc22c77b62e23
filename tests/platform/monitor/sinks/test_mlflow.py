"""The MLflow sink against a real tracking server (SQLite backend, on loopback), started once
for the module."""

import pytest
from mlflow.tracking import MlflowClient

from common.addresses import Refused
from monitor.ingest import GROUP, StreamIngest
from monitor.sinks.consumer import SinkConsumer, group_of
from monitor.sinks.models import Sink, SinkKind, SinkState
from monitor.sinks.options import SinkError, parse
from tests.platform.monitor.sinks.conftest import SERIES, STEPS, history, publish_run, write_all

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_job_is_one_run_with_its_spec_as_params_its_series_and_checkpoint_links(
        job, bus, platform_redis_url, server, mlflow_sink):
    publish_run(job, platform_redis_url)
    write_all(mlflow_sink, bus).close()
    mlflow_sink.refresh_from_db()

    run = MlflowClient(tracking_uri=server.url).get_run(mlflow_sink.run_id)
    assert run.info.run_name == f"t (job {job.pk})"
    assert run.data.params["model.preset"] == "nano"
    assert run.data.params["train.steps"] == "6"
    assert run.data.tags["ringside.job"] == str(job.pk)
    assert run.data.tags["checkpoint.disk.4"] == f"/runs/{job.pk}/checkpoints/step-4"
    for name in SERIES:
        assert [step for step, _ in history(server, run.info.run_id, name)] == list(STEPS), name
    assert history(server, run.info.run_id, "eval_loss") == [(3, pytest.approx(5.0 / 3)),
                                                             (6, pytest.approx(5.0 / 6))]
    assert (mlflow_sink.state, mlflow_sink.last_seq) == (SinkState.WRITING, 9)


def test_a_server_down_mid_run_loses_nothing_once_it_is_back(job, bus, platform_redis_url,
                                                            server, mlflow_sink, monkeypatch):
    publish_run(job, platform_redis_url, steps=range(1, 4))
    consumer = write_all(mlflow_sink, bus)
    server.freeze()
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    publish_run(job, platform_redis_url, steps=range(4, 7))
    try:
        with pytest.raises(Exception, match="timed out"):
            consumer.poll()
    finally:
        server.thaw()
    mlflow_sink.refresh_from_db()
    assert mlflow_sink.state == SinkState.FAILING
    assert "timed out" in mlflow_sink.last_error
    # the ingest, on its own group, stored everything meanwhile
    ingest = StreamIngest(job.pk, bus, consumer="ingest")
    assert len(ingest.drain()) == 9
    assert bus.xpending(ingest.stream, GROUP)["pending"] == 0
    assert bus.xpending(ingest.stream, group_of(SinkKind.MLFLOW))["pending"] > 0

    monkeypatch.undo()
    while consumer.poll():
        pass
    assert [step for step, _ in history(server, mlflow_sink.run_id, "loss")] == list(STEPS)
    assert bus.xpending(ingest.stream, group_of(SinkKind.MLFLOW))["pending"] == 0
    mlflow_sink.refresh_from_db()
    assert (mlflow_sink.state, mlflow_sink.last_error) == (SinkState.WRITING, "")


def test_a_users_tracking_uri_must_be_a_public_address(job, bus, platform_redis_url):
    with pytest.raises(SinkError) as refused:
        parse(["tensorboard", {"kind": "mlflow", "tracking_uri": "http://127.0.0.1:5000"}])
    assert refused.value.errors == {"sinks.1.tracking_uri": "not a public address"}
    # checked again when the sink connects: a name may resolve elsewhere by then
    sink = Sink.objects.create(job=job, kind=SinkKind.MLFLOW,
                               config={"kind": "mlflow", "tracking_uri": "http://localhost:1/"})
    publish_run(job, platform_redis_url, steps=[1])
    with pytest.raises(Refused):
        SinkConsumer(sink, bus).poll()
    sink.refresh_from_db()
    assert (sink.state, sink.last_error) == (SinkState.FAILING, "Refused: not a public address")
