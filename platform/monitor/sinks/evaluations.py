"""A finished evaluation's results, told to the job's sinks through the job's event stream
(an `evaluation` event at the checkpoint's step, engine.contract), so a sink that is down
writes them once it is back, as it does the engine's events.

The event goes after the stream's newest entry `<seq>-<n>`, as `<seq>-<n+1>`: the engine's
next event, `<seq+1>-0`, still follows it. While the job's supervisor runs, its sink threads
read it; otherwise (the job ended, or waits) each sink's `catch_up` task does.
"""

from __future__ import annotations

import json
import time

import redis
from django.conf import settings

from engine import contract
from jobs.models import Evaluation, Job
from monitor.sinks.consumer import catch_up
from monitor.sinks.models import Sink

S = contract.JobState
# the states in which no supervisor polls the job's sinks
UNWATCHED = contract.FINAL_STATES | {S.QUEUED, S.PAUSED, S.WAITING_FOR_HOSTS}


def publish(evaluation: Evaluation) -> dict:
    """Append `evaluation`'s results to its job's event stream; the event's wire form."""
    checkpoint = evaluation.checkpoint
    stream = contract.events_stream(str(checkpoint.job_id))
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        while True:
            newest = client.xrevrange(stream, count=1)
            seq, n = contract.entry_seq(newest[0][0]) if newest else (0, 0)
            wire = contract.EvaluationEvent(
                step=checkpoint.step, job=str(checkpoint.job_id), time=time.time(), seq=seq,
                evaluation=evaluation.pk, checkpoint=checkpoint.path,
                heldout=evaluation.results.get("heldout", {}),
                tasks=evaluation.results.get("tasks", {})).to_dict()
            try:
                client.xadd(stream, contract.stream_entry(wire["type"], json.dumps(wire)),
                            id=contract.entry_id(seq, n + 1))
                break
            except redis.ResponseError as error:  # the engine published meanwhile
                if "equal or smaller" not in str(error):
                    raise
    finally:
        client.close()
    if Job.objects.filter(pk=checkpoint.job_id, state__in=UNWATCHED).exists():
        for sink in Sink.objects.filter(job_id=checkpoint.job_id):
            catch_up.delay(sink.pk)
    return wire
