"""`manage.py worker`: one worker host. Registers the host (hosts.registry), beats it every
HOST_BEAT_S in a thread, and runs a Celery worker in this process on the shared queue
(CELERY_TASK_DEFAULT_QUEUE) and the host's own (`host.<name>`), WORKER_CONCURRENCY pool
processes; with RINGSIDE_SLURM_SUBMIT=1 (a machine with Slurm's clients) also the Slurm jobs'
supervisors' queue (jobs.backends.slurm). A name another live worker holds is refused: exit
code 2, the reason on stderr.

Stopping it marks nothing: its beat stops, and the host counts as lost HOST_LOST_AFTER_S
later. A worker whose name was taken over while it was lost (cut off) stops itself.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from celery import current_app
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, connections

from hosts import live, registry
from hosts.models import Host

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run this machine's worker host: register it, beat it, and consume its queues."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loglevel", default="INFO")

    def handle(self, *args, loglevel: str, **options) -> None:
        # The pool processes fork from this one, and a pool of connections would go with
        # them: a process forked after a beat took that beat's pooled connection (the same
        # socket) and hung at its first query (1 fork in 200-400 measured). A worker's processes
        # open connections of their own instead.
        for database in settings.DATABASES.values():
            database.get("OPTIONS", {}).pop("pool", None)
        try:
            host = registry.register(registry.this_host())
        except registry.HostNameTaken as refused:
            raise CommandError(str(refused), returncode=2) from None
        live.publish(host.name)
        self.stdout.write(f"[worker] host {host.name} at {host.address}: {host.slots} slots, "
                          f"queues {settings.CELERY_TASK_DEFAULT_QUEUE} and {host.queue}")
        self.stdout.flush()
        # the pool processes fork from this one: none may inherit a connection in use
        connections.close_all()
        stop = threading.Event()
        threading.Thread(target=beat_forever, args=(host, stop), name="host-beat",
                         daemon=True).start()
        queues = [settings.CELERY_TASK_DEFAULT_QUEUE, host.queue]
        if settings.SLURM_SUBMIT:  # this machine has Slurm's clients: it supervises Slurm jobs
            queues.append(settings.SLURM_QUEUE)
        try:
            current_app.worker_main([
                "worker", "--loglevel", loglevel,
                "--queues", ",".join(queues),
                "--concurrency", str(settings.CELERY_WORKER_CONCURRENCY),
                # hosts find each other through the registry, not Celery's broadcasts
                "--without-mingle", "--without-gossip",
                "--hostname", f"{host.name}.{os.getpid()}@%h"])
        finally:
            stop.set()


def beat_forever(host: Host, stop: threading.Event) -> None:
    """Beat every HOST_BEAT_S until `stop`; a failed beat (database away) is logged and
    retried at the next one. Taken over by another worker: stop this one."""
    while not stop.wait(settings.HOST_BEAT_S):
        try:
            registry.beat(host)
        except registry.HostTakenOver as error:
            log.error("%s; stopping this worker", error)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        except Exception:
            log.warning("host %s: beat failed; retrying", host.name, exc_info=True)
            connection.close()  # the next beat opens a fresh one
            continue
        live.publish(host.name)
