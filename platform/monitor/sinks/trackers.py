"""The trackers a sink writes to, one class each with the shape of torchtitan's metric loggers:
`write(records)` and `close()`. A tracker that cannot take a batch raises; its consumer
(monitor.sinks.consumer) keeps the batch unacknowledged, drops the tracker and opens a new one
on its next try, so `write` may see records it saw before: each tracker takes them again
without harm (MLflow keeps a metric's (step, time, value) once; TensorBoard and W&B read a step
written again as that step).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings

from common.addresses import reachable
from jobs.launch import run_dir
from jobs.models import Job
from monitor.sinks import secrets
from monitor.sinks.models import SecretName, Sink, SinkKind
from monitor.sinks.records import CheckpointLink, Note, Record, Scalars

# MLflow's client retries an unreachable server for minutes by default, holding its consumer;
# the consumer retries itself, with its own backoff (the operator may still set these)
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

MLFLOW_BATCH = 1000  # metrics (and params, tags) per log_batch request: the server's limit
MLFLOW_PARAMS = 100
MLFLOW_PARAM_CHARS = 6000
WANDB_CHECKPOINT_STEP = "checkpoint_step"  # the x-axis of the `eval/` series


class TrackerError(RuntimeError):
    """A tracker that cannot be used as configured; the message is for the job's owner."""


class Tracker(Protocol):
    def write(self, records: list[Record]) -> None: ...

    def close(self) -> None: ...


def open_tracker(sink: Sink) -> Tracker:
    job = Job.objects.select_related("owner").get(pk=sink.job_id)
    return {SinkKind.TENSORBOARD: TensorBoard, SinkKind.MLFLOW: MLflow,
            SinkKind.WANDB: WandB}[sink.kind](sink, job)


def tensorboard_dir(job: Job) -> Path:
    return run_dir(job) / "tensorboard"


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as dotted keys: {"train": {"lr": 1}} → {"train.lr": 1}."""
    if not isinstance(value, dict):
        return {prefix[:-1]: value}
    found: dict[str, Any] = {}
    for key, inner in value.items():
        found.update(flat(inner, f"{prefix}{key}."))
    return found


class TensorBoard:
    """Event files in the job's run folder, `tensorboard --logdir runs/<job>/tensorboard`: one
    event per step holding all its numbers (a step's dozen series cost one write, not a dozen)."""

    def __init__(self, sink: Sink, job: Job):
        from torch.utils.tensorboard.writer import FileWriter

        self.writer = FileWriter(str(tensorboard_dir(job)))

    def write(self, records: list[Record]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.summary import scalar, text

        for r in records:
            if isinstance(r, Scalars):
                summary = Summary(value=[value for name, number in r.values.items()
                                         for value in scalar(name, number).value])
            elif isinstance(r, Note):
                summary = text(r.tag, r.text)
            elif isinstance(r, CheckpointLink):
                summary = text("checkpoint", f"{r.tier}: {r.path}")
            self.writer.add_summary(summary, r.step, r.time)
        self.writer.flush()  # on disk before the consumer acknowledges

    def close(self) -> None:
        self.writer.close()


class MLflow:
    """One run per job on a tracking server: the spec as params, every series as metrics by
    step, each checkpoint's folder as a tag (`checkpoint.<tier>.<step>`). The run is made on
    the first write and kept in `Sink.run_id`, so every later launch writes to it."""

    def __init__(self, sink: Sink, job: Job):
        from mlflow.store.tracking.rest_store import RestStore
        from mlflow.utils.rest_utils import MlflowHostCreds

        uri = sink.config.get("tracking_uri")
        if uri:
            reachable(uri)  # a user's server: public now too, or refused (common.addresses)
        else:
            uri = settings.RINGSIDE_MLFLOW_TRACKING_URI
        token = secrets.reveal(job.owner_id, SecretName.MLFLOW_TOKEN)
        creds = MlflowHostCreds(uri.rstrip("/"), token=token)
        self.store = RestStore(lambda: creds)
        self.sink, self.job = sink, job
        self.run_id = sink.run_id or self._new_run()

    def _new_run(self) -> str:
        from mlflow.entities import Param, RunTag

        experiment = self._experiment(self.sink.config.get("experiment", "ringside"))
        run = self.store.create_run(
            experiment, user_id=self.job.owner.get_username(), start_time=int(time.time() * 1000),
            tags=[RunTag("ringside.job", str(self.job.pk))],
            run_name=f"{self.job.name} (job {self.job.pk})")
        run_id = run.info.run_id
        params = [Param(k, str(v)[:MLFLOW_PARAM_CHARS]) for k, v in flat(self.job.spec).items()]
        for start in range(0, len(params), MLFLOW_PARAMS):
            self.store.log_batch(run_id, [], params[start:start + MLFLOW_PARAMS], [])
        Sink.objects.filter(pk=self.sink.pk).update(run_id=run_id)
        return run_id

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self.store.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.store.create_experiment(name)
        except MlflowException:  # made meanwhile by another job's sink
            return self.store.get_experiment_by_name(name).experiment_id

    def write(self, records: list[Record]) -> None:
        from mlflow.entities import Metric, RunTag

        metrics, tags = [], []
        for r in records:
            if isinstance(r, Scalars):
                metrics += [Metric(name, value, int(r.time * 1000), r.step)
                            for name, value in r.values.items()]
            elif isinstance(r, CheckpointLink):
                tags.append(RunTag(f"checkpoint.{r.tier}.{r.step}", r.path))
        for start in range(0, len(metrics), MLFLOW_BATCH):
            self.store.log_batch(self.run_id, metrics[start:start + MLFLOW_BATCH], [], [])
        for start in range(0, len(tags), MLFLOW_PARAMS):
            self.store.log_batch(self.run_id, [], [], tags[start:start + MLFLOW_PARAMS])

    def close(self) -> None:
        """Nothing held open: each write is its own requests."""


class WandB:
    """A W&B run under the job's run folder (`wandb/offline-run-*` for `wandb sync`), or
    online with the owner's API key. Its id is kept in `Sink.run_id` before the run starts, so
    a relaunch (a resume, a restart) continues the same run."""

    def __init__(self, sink: Sink, job: Job):
        import wandb
        from wandb.sdk.lib.runid import generate_id

        mode = sink.config.get("mode", "offline")
        key = secrets.reveal(job.owner_id, SecretName.WANDB_API_KEY)
        if mode == "online" and not key:
            raise TrackerError("no W&B API key: set yours with PUT /api/me/secrets/"
                               f"{SecretName.WANDB_API_KEY}/")
        run_id = sink.run_id or generate_id()
        Sink.objects.filter(pk=sink.pk).update(run_id=run_id)
        run_dir(job).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=sink.config.get("project"), entity=sink.config.get("entity"), id=run_id,
            resume="allow", name=f"{job.name} (job {job.pk})", config=job.spec,
            dir=str(run_dir(job)), reinit="create_new",
            settings=wandb.Settings(mode=mode, api_key=key if mode == "online" else None,
                                    silent=True, console="off", save_code=False,
                                    disable_git=True, x_disable_stats=True,
                                    x_disable_machine_info=True))
        # W&B takes a run's rows in step order only, and a checkpoint is evaluated while
        # training goes on: its scores join the newest row, charted by their own step
        self.run.define_metric(WANDB_CHECKPOINT_STEP)
        self.run.define_metric("eval/*", step_metric=WANDB_CHECKPOINT_STEP)

    def write(self, records: list[Record]) -> None:
        for r in records:
            if isinstance(r, Scalars) and r.evaluation:
                self.run.log({**r.values, WANDB_CHECKPOINT_STEP: r.step}, commit=False)
            elif isinstance(r, Scalars):
                self.run.log(r.values, step=r.step)
            elif isinstance(r, Note):
                self.run.log({r.tag: r.text}, step=r.step)
            elif isinstance(r, CheckpointLink):
                self.run.log({f"checkpoint.{r.tier}": r.path}, step=r.step)

    def close(self) -> None:
        self.run.finish()
