"""The TensorBoard sink: the job's event files, read back with TensorBoard's own reader."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from monitor.sinks.models import Sink, SinkKind, SinkState
from monitor.sinks.trackers import tensorboard_dir
from tests.platform.monitor.sinks.conftest import EVAL_STEPS, SERIES, STEPS, publish_run, write_all

pytestmark = pytest.mark.django_db(transaction=True)


def read_back(job) -> EventAccumulator:
    files = EventAccumulator(str(tensorboard_dir(job)), size_guidance={"scalars": 0, "tensors": 0})
    files.Reload()
    return files


def test_every_series_is_in_the_event_files_at_every_stored_step(job, bus, platform_redis_url):
    publish_run(job, platform_redis_url)
    sink = Sink.objects.create(job=job, kind=SinkKind.TENSORBOARD)
    write_all(sink, bus).close(SinkState.CLOSED)

    files = read_back(job)
    for name in SERIES:
        assert [e.step for e in files.Scalars(name)] == list(STEPS), name
    assert [e.value for e in files.Scalars("loss")] == pytest.approx([6.0 / s for s in STEPS])
    for name in ("eval_loss", "eval_source_loss.web", "eval_source_loss.code"):
        assert [e.step for e in files.Scalars(name)] == list(EVAL_STEPS), name
    assert files.Scalars("eval_loss")[-1].value == pytest.approx(5.0 / 6)
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in files.Tensors(tag)]
             for tag in files.Tags()["tensors"]}
    assert texts["anomaly/text_summary"] == [(4, 'loss_spike (warning): {"loss":9.0}')]
    assert texts["action/text_summary"] == [(4, "skip_update by policy: the loss spiked")]
    assert texts["checkpoint/text_summary"] == [(4, f"disk: /runs/{job.pk}/checkpoints/step-4")]
    sink.refresh_from_db()
    assert (sink.state, sink.last_seq, sink.last_error) == (SinkState.CLOSED, 9, "")


def test_a_relaunch_writes_on_from_where_the_sink_stopped(job, bus, platform_redis_url):
    """A new consumer of the same sink (the job's next launch) writes only what is new."""
    publish_run(job, platform_redis_url, steps=range(1, 4))
    sink = Sink.objects.create(job=job, kind=SinkKind.TENSORBOARD)
    write_all(sink, bus).close()
    publish_run(job, platform_redis_url, steps=range(4, 7))
    write_all(sink, bus).close()
    assert [e.step for e in read_back(job).Scalars("loss")] == list(STEPS)
