"""A job whose event stream holds what a short run publishes, read by its sinks; a real MLflow
tracking server (SQLite backend, on loopback), started once per module that asks for it."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from mlflow.tracking import MlflowClient

from common.services import stop_process_group, wait_for_port
from engine.ports import free_port
from engine.runtime.events import EventLog
from jobs.models import Job
from monitor.sinks.consumer import SinkConsumer
from monitor.sinks.models import Sink, SinkKind
from monitor.sinks.options import parse

STEPS = range(1, 7)
EVAL_STEPS = (3, 6)
SOURCES = ("web", "code")
SERIES = ("loss", "grad_norm", "lr", "tokens_per_s", "step_time", "source_loss.web",
          "source_loss.code")


def publish_run(job: Job, url: str, steps=STEPS) -> None:
    """Step events (with per-source losses, an evaluation every few steps), an anomaly, the
    action that answered it and a checkpoint, as the engine publishes them."""
    log = EventLog(str(job.pk), bus_url=url)
    for step in steps:
        evaluation = ({"eval_loss": 5.0 / step,
                       "eval_source_loss": {s: 5.0 / step + i for i, s in enumerate(SOURCES)}}
                      if step in EVAL_STEPS else {})
        log.emit_wire("step", step, loss=6.0 / step, grad_norm=1.0 + step, lr=1e-3 * step,
                      tokens_per_s=1e4 + step, step_time=0.1, tokens=1000 * step,
                      memory={"rss_bytes": 2**30},
                      source_loss={s: 6.0 / step + i for i, s in enumerate(SOURCES)},
                      **evaluation)
        if step == 4:
            log.emit_wire("anomaly", step, kind="loss_spike", severity="warning", rank=None,
                          evidence={"loss": 9.0})
            log.emit_wire("action", step, action="skip_update", by="policy",
                          anomaly="loss_spike", reason="the loss spiked")
            log.emit_wire("checkpoint", step, path=f"/runs/{job.pk}/checkpoints/step-4",
                          tier="disk", blocking_s=0.01, size_bytes=1024, strategy="NNN",
                          world_size=1)
    log.close()


def write_all(sink: Sink, client: redis.Redis) -> SinkConsumer:
    """A consumer of `sink` that wrote every event in the stream (its tracker still open)."""
    consumer = SinkConsumer(sink, client)
    while consumer.poll(block_ms=None):
        pass
    return consumer


class TrackingServer:
    """`mlflow server` on a free port, that can be made to stop answering and come back
    (SIGSTOP, SIGCONT: a restart of the server costs a minute on a busy test machine)."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        mlflow = Path(sys.executable).parent / "mlflow"
        self.proc = subprocess.Popen(
            [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{self.folder}/mlflow.db",
             "--default-artifact-root", str(self.folder / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # no job runner processes beside it: the tests need the tracking API only
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        wait_for_port(self.port, 120, self.proc)

    def freeze(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.thaw()
        stop_process_group(self.proc, grace_s=5)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tracking = TrackingServer(tmp_path_factory.mktemp("mlflow"))
    tracking.start()
    yield tracking
    tracking.stop()


@pytest.fixture
def mlflow_sink(job, server, settings):
    settings.RINGSIDE_MLFLOW_TRACKING_URI = server.url  # the operator's: loopback is fine
    return Sink.objects.create(job=job, kind=SinkKind.MLFLOW,
                               config=parse([{"kind": "mlflow", "experiment": "sinks"}])[0])


def history(server, run_id: str, name: str) -> list[tuple[int, float]]:
    metrics = MlflowClient(tracking_uri=server.url).get_metric_history(run_id, name)
    return sorted((m.step, m.value) for m in metrics)
