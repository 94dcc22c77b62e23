"""`manage.py worker`, run for real: it registers its host, beats it, consumes the shared queue
and its own `host.<name>`; a second worker with the same live name exits 2 saying why; a killed
worker's host turns lost, and a worker started again on this machine takes the name at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from common.services import REPO_ROOT, stop_process_group
from hosts.models import Host

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def start_worker(service_env, tmp_path):
    """start_worker(name) -> a running `manage.py worker` for host `name`."""
    procs = []

    def start(name: str, **env: str) -> subprocess.Popen:
        environ = {**service_env, "RINGSIDE_HOST_NAME": name, "HOST_BEAT_S": "0.5",
                   "WORKER_CONCURRENCY": "1", **env}
        proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "manage.py"), "worker"],
                                env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        stop_process_group(proc, grace_s=10)


def test_a_worker_registers_its_host_beats_and_consumes_its_queues(start_worker, eventually):
    from ringside.celery import app

    name = f"w-{os.getpid()}"
    start_worker(name, WORKER_SLOTS="3", WORKER_LABELS="zone=z1, rack=r2",
                 RINGSIDE_HOST_ADDRESS="10.9.8.7")
    eventually(lambda: Host.objects.filter(name=name).exists(), 60, "the host registers")
    host = Host.objects.get(name=name)
    assert (host.slots, host.labels, host.address) == (3, {"zone": "z1", "rack": "r2"},
                                                      "10.9.8.7")
    assert host.devices["cpu"]["cores"] >= 1 and host.devices["gpus"] == []
    first = host.beat_at
    eventually(lambda: Host.objects.get(name=name).beat_at > first, 10, "the host beats")

    def queues() -> set[str]:
        found = app.control.inspect(timeout=1.0).active_queues() or {}
        return {q["name"] for node, qs in found.items() if node.startswith(f"{name}.")
                for q in qs}

    shared = app.conf.CELERY_TASK_DEFAULT_QUEUE
    eventually(lambda: queues() == {shared, f"host.{name}"}, 60,
               "the worker consumes the shared queue and its own")


def test_a_live_name_is_refused_and_a_killed_workers_host_turns_lost(start_worker, eventually,
                                                                      settings):
    name = f"w2-{os.getpid()}"
    first = start_worker(name)
    eventually(lambda: Host.objects.filter(name=name).exists(), 60, "the host registers")
    second = start_worker(name)
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 2, out
    assert f"RINGSIDE_HOST_NAME: host '{name}' is held by another live worker" in out

    settings.HOST_LOST_AFTER_S = 2.0
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    eventually(lambda: Host.objects.get(name=name).state == "lost", 10, "the host turns lost")
    # its process is gone from this machine: a new worker takes the name without waiting
    settings.HOST_LOST_AFTER_S = 30.0
    old = Host.objects.get(name=name).instance
    start_worker(name)
    eventually(lambda: Host.objects.get(name=name).instance != old, 60, "the name is taken over")
    assert Host.objects.get(name=name).state == "up"
