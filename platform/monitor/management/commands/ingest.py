"""`manage.py ingest JOB [JOB ...]`: run the ingest of some jobs' event streams as a process of
its own, until SIGINT/SIGTERM (the batch in hand is finished first).

The job supervisor runs the same loop for the job it supervises; this command is for
re-ingesting a stream, for ingest outside the worker, and for the crash tests: kill it at any
moment and start it again (under any consumer name) and every event is stored exactly once.
"""

from __future__ import annotations

import signal
import time
from types import FrameType

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from monitor.ingest import DEFAULT_CLAIM_IDLE_MS, StreamIngest

IDLE_SLEEP_S = 0.05


class Command(BaseCommand):
    help = "Store and forward the events of the given jobs' streams until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("jobs", nargs="+", type=int, metavar="JOB")
        parser.add_argument("--consumer", default="ingest",
                            help="consumer name in the stream's group (default: ingest)")
        parser.add_argument("--claim-idle-ms", type=int, default=DEFAULT_CLAIM_IDLE_MS,
                            help="take over entries another consumer left unacknowledged "
                                 "for this long (default: %(default)s)")

    def handle(self, *args, jobs: list[int], consumer: str, claim_idle_ms: int,
               **options) -> None:
        self.stopping = False
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(signal.SIGTERM, self.stop)
        client = redis.Redis.from_url(settings.REDIS_URL)
        ingests = [StreamIngest(job, client, consumer, claim_idle_ms) for job in jobs]
        # with one stream, wait on it; with several, poll each in turn without waiting
        block_ms = 200 if len(ingests) == 1 else None
        try:
            while not self.stopping:
                stored = sum(len(ingest.poll(block_ms=block_ms)) for ingest in ingests)
                if not stored and block_ms is None:
                    time.sleep(IDLE_SLEEP_S)
        finally:
            client.close()

    def stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
