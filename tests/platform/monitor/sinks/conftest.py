"""A job whose event stream holds what a short run publishes, read by its sinks."""

import redis

from engine.runtime.events import EventLog
from jobs.models import Job
from monitor.sinks.consumer import SinkConsumer
from monitor.sinks.models import Sink

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
