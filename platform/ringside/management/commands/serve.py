"""`manage.py serve` (what `make run` runs): the whole platform as one supervised process tree.

Migrates, makes sure the `admin` user exists, then starts and watches its children: an
embedded Redis (unless REDIS_URL is set), the ASGI server (uvicorn, WEB_PROCESSES processes)
on PORT, this machine's worker host (`manage.py worker`: its Celery worker) and Celery beat
(the reaper of lost jobs, jobs.tasks.reap). A child that dies is restarted with backoff.
SIGINT/SIGTERM stops the training ranks first (so their supervisors record how the jobs
ended), then beat, the worker, the web server and Redis, and exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import psutil
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from common.services import (
    REPO_ROOT,
    add_web_address_arguments,
    child_env,
    port_in_use,
    python_module,
    redis_server_command,
    wait_for_port,
    web_processes,
    web_server_command,
)
from engine.contract import free_port

MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0  # a child that ran this long restarts without delay when it dies
STOP_GRACE_S = 10.0


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    backoff: float = 1.0
    restart_at: float | None = None
    restarts: int = 0

    def start(self) -> None:
        # its own session: Ctrl-C in the terminal reaches only `serve`, which stops children
        # in order
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.started = time.monotonic()

    def stop(self, timeout: float = STOP_GRACE_S) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        tree = _descendants(self.proc.pid)
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for p in tree:  # anything it left behind
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


class Command(BaseCommand):
    help = "Run the whole platform (Redis, web server, worker host) under one supervisor."

    def add_arguments(self, parser):
        add_web_address_arguments(parser)

    def handle(self, *args, host: str, port: int, **options) -> None:
        if port_in_use(port):
            raise CommandError(f"port {port} is already in use (another Ringside still running?); "
                               "stop it or set PORT")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("ensure_admin", stdout=self.stdout)
        self.stopping = False
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)

        children = []
        redis_url = os.environ.get("REDIS_URL")
        if not redis_url:
            redis_port = free_port()
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            redis_child = Child("redis", redis_server_command(redis_port,
                                                              settings.VAR_DIR / "redis"),
                                child_env())
            redis_child.start()
            wait_for_port(redis_port, 15, redis_child.proc)
            children.append(redis_child)
            self.log(f"embedded Redis on {redis_url}")
        env = child_env(REDIS_URL=redis_url)
        web = Child("web", web_server_command(host, port, web_processes(),
                                              settings.TRUSTED_PROXIES), env)
        # this machine as a worker host (hosts app): the Celery worker runs in that process
        worker = Child("worker", [sys.executable, str(REPO_ROOT / "manage.py"), "worker"], env)
        # the periodic reaper (jobs.tasks.reap) that requeues jobs whose supervisor was lost
        beat = Child("beat", python_module(
            "celery", "-A", "ringside", "beat", "--loglevel", "WARNING"), env)
        for child in (web, worker, beat):
            child.start()
            children.append(child)
        wait_for_port(port, 60, web.proc, host="127.0.0.1" if host == "0.0.0.0" else host)
        shown = "127.0.0.1" if host == "0.0.0.0" else host
        self.log(self.style.SUCCESS(f"Ringside is up: open http://{shown}:{port}/ "
                                    "(user admin; API docs at /api/docs/). Ctrl-C stops it."))
        try:
            self.watch(children)
        finally:
            self.shutdown(worker, web, beat, children)

    def request_stop(self, signum, frame) -> None:
        if not self.stopping:
            self.log(f"{signal.Signals(signum).name}: stopping the platform")
        self.stopping = True

    def watch(self, children: list[Child]) -> None:
        while not self.stopping:
            now = time.monotonic()
            for child in children:
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        child.restart_at = None
                        child.restarts += 1
                        child.start()
                        self.log(f"{child.name} restarted (restart #{child.restarts})")
                    continue
                code = child.proc.poll()
                if code is None:
                    continue
                if now - child.started > HEALTHY_AFTER_S:
                    child.backoff = 1.0
                self.log(self.style.WARNING(
                    f"{child.name} exited with code {code}; restarting in {child.backoff:.0f} s"))
                child.restart_at = now + child.backoff
                child.backoff = min(child.backoff * 2, MAX_BACKOFF_S)
            time.sleep(0.25)

    def shutdown(self, worker: Child, web: Child, beat: Child, children: list[Child]) -> None:
        # Training ranks run under the worker's pool processes (children of the worker's main
        # process). SIGTERM them first: the engine stops its ranks and each job's supervisor
        # records the outcome while the database, Redis and the worker are still up.
        if worker.proc is not None and worker.proc.poll() is None:
            engines = [p for pool in psutil.Process(worker.proc.pid).children()
                       for p in pool.children()]
            for p in engines:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
            psutil.wait_procs(engines, timeout=settings.JOB_CANCEL_GRACE_S + 5)
            time.sleep(1.0)  # let the supervisors write the final states
        for child in (beat, worker, web, *(c for c in children if c not in (beat, worker, web))):
            child.stop()
        self.log("stopped")

    def log(self, message: str) -> None:
        self.stdout.write(f"[serve] {message}")
        self.stdout.flush()
