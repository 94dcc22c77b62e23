"""What a worker records about its host: register at start, beat while it runs, and what staff
change (drain). Device discovery and the host's address and version live here too.

Web processes import this module (the API drains hosts); it never imports torch. A GPU host's
devices are read by a short subprocess, so CUDA is never initialised in the worker's main
process, whose pool processes are forked from it.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
from django.conf import settings
from django.db import IntegrityError, connection, transaction

from hosts.models import Host
from hosts.signals import host_available

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
MIN_CPU_SLOTS = 8  # the emulated shapes (2 nodes x 4 ranks) fit a laptop
# the clock now, not the transaction's start (PostgreSQL's now()); SQLite's to the millisecond
NOW_SQL = {"postgresql": "SELECT clock_timestamp()",
           "sqlite": "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')"}
GPU_QUERY = ("import json, torch; print(json.dumps([{'name': torch.cuda.get_device_name(i), "
             "'memory_bytes': torch.cuda.get_device_properties(i).total_memory} "
             "for i in range(torch.cuda.device_count())]))")


class HostNameTaken(Exception):
    """Another live worker holds the name."""

    def __init__(self, host: Host):
        super().__init__(
            f"RINGSIDE_HOST_NAME: host {host.name!r} is held by another live worker "
            f"(at {host.address}, instance {host.instance}, last beat {host.beat_at:%H:%M:%S} "
            f"UTC); pick another name, or stop that worker and wait "
            f"{settings.HOST_LOST_AFTER_S:g} s for it to count as lost")


class HostTakenOver(Exception):
    """A worker beat a name that another instance registered since (this one was lost)."""


@dataclass
class HostInfo:
    """What a worker says about its host."""

    name: str
    address: str
    devices: dict[str, Any]
    slots: int
    labels: dict[str, str] = field(default_factory=dict)
    version: str = ""
    instance: str = field(default_factory=lambda: new_instance())


def new_instance() -> str:
    """`<machine>:<pid>:<random>`: the machine and pid let a worker restarted on the same
    machine take over at once from its dead predecessor (see `_gone`)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _gone(instance: str) -> bool:
    """The instance was a process of this machine that no longer runs."""
    machine, _, rest = instance.partition(":")
    pid = rest.partition(":")[0]
    return machine == socket.gethostname() and pid.isdigit() and not psutil.pid_exists(int(pid))


def gpus() -> list[dict[str, Any]]:
    """Each GPU's name and memory; none without an NVIDIA driver (no subprocess then). Read
    in a subprocess: torch and CUDA stay out of the process that forks the worker's pool."""
    if not (shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists()):
        return []
    try:
        done = subprocess.run([sys.executable, "-c", GPU_QUERY], capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        log.warning("GPU discovery timed out; registering the host without GPUs")
        return []
    if done.returncode:
        log.warning("GPU discovery failed; registering without GPUs: %s", done.stderr[-500:])
        return []
    return json.loads(done.stdout.strip().splitlines()[-1])


def devices() -> dict[str, Any]:
    return {"cpu": {"cores": psutil.cpu_count(logical=True) or 1,
                    "memory_bytes": psutil.virtual_memory().total},
            "gpus": gpus()}


def slots_for(found: dict[str, Any]) -> int:
    """One per GPU; on a CPU host WORKER_SLOTS, else the core count but at least 8."""
    if found["gpus"]:
        return len(found["gpus"])
    return settings.WORKER_SLOTS or max(found["cpu"]["cores"], MIN_CPU_SLOTS)


@cache
def version() -> str:
    """The package version, with the commit (`git describe`) when run from a checkout: two
    hosts on different code show different versions."""
    try:
        package = importlib.metadata.version("ringside")
    except importlib.metadata.PackageNotFoundError:
        package = "unknown"
    if not (REPO_ROOT / ".git").exists() or not shutil.which("git"):
        return package
    done = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
                          capture_output=True, text=True, timeout=10)
    return f"{package}+{done.stdout.strip()}" if done.returncode == 0 else package


def host_address() -> str:
    """RINGSIDE_HOST_ADDRESS, else the address of the interface that reaches Redis (a UDP
    socket's connect picks the route and sends nothing)."""
    if settings.RINGSIDE_HOST_ADDRESS:
        return settings.RINGSIDE_HOST_ADDRESS
    url = urlsplit(settings.REDIS_URL)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((url.hostname or "127.0.0.1", url.port or 6379))
        return probe.getsockname()[0]


def this_host() -> HostInfo:
    """This machine as the settings and its devices describe it."""
    found = devices()
    return HostInfo(name=settings.RINGSIDE_HOST_NAME, address=host_address(), devices=found,
                    slots=slots_for(found), labels=dict(settings.WORKER_LABELS),
                    version=version())


def register(info: HostInfo) -> Host:
    """Upsert the host by name for this worker instance. Raises HostNameTaken when another
    live instance holds the name; a lost one's row is taken over, as is a live one's whose
    process on this machine is gone (`serve` restarting its worker). Drained stays as staff
    set it."""
    fields = {"address": info.address, "devices": info.devices, "slots": info.slots,
              "labels": info.labels, "version": info.version, "instance": info.instance}
    for attempt in range(2):
        try:
            with transaction.atomic():
                now = _database_now()
                host = Host.objects.select_for_update().filter(name=info.name).first()
                if host is None:
                    host = Host.objects.create(name=info.name, started_at=now, beat_at=now,
                                               **fields)
                    return _available(host)
                if (host.instance != info.instance and not host.is_lost
                        and not _gone(host.instance)):
                    raise HostNameTaken(host)
                for key, value in {**fields, "started_at": now, "beat_at": now}.items():
                    setattr(host, key, value)
                host.save()
                return _available(host)
        except IntegrityError:  # another worker created the name first: judge it again
            if attempt:
                raise
    raise AssertionError("unreachable")


def beat(host: Host) -> Host:
    """Record a beat (the database's clock) and the worker's clock offset from it; a host
    whose row was deleted is registered again. Raises HostTakenOver when another instance
    registered the name since this one's last beat."""
    sent = time.time()
    now = _database_now()
    offset = (sent + time.time()) / 2 - now.timestamp()
    mine = Host.objects.filter(name=host.name, instance=host.instance)
    # a peer found it silent (lost_at) or its previous beat aged: cut off since, and now back
    was_lost = host.is_lost or mine.filter(lost_at__isnull=False).exists()
    updated = mine.update(beat_at=now, clock_offset_s=offset, lost_at=None)
    host.lost_at = None
    host.beat_at, host.clock_offset_s = now, offset
    if updated:
        return _available(host) if was_lost else host
    try:  # the row is gone (deleted by hand, a test database flushed): this worker's again
        with transaction.atomic():
            host.pk = None
            host.save(force_insert=True)
        return _available(host)
    except IntegrityError:  # the name's row exists: another worker holds it now
        raise HostTakenOver(f"host {host.name!r} was registered by another worker while this "
                            "one was lost") from None


def set_drained(host: Host, drained: bool, actor: str) -> Host:
    """Drain (no new placements; running jobs move off at their next checkpoint) or undrain."""
    Host.objects.filter(pk=host.pk).update(drained=drained)
    host.drained = drained
    log.info("host %s %s by %s", host.name, "drained" if drained else "undrained", actor)
    return host if drained else _available(host)


def _available(host: Host) -> Host:
    """Tell the scheduler (hosts.signals) once the change is committed. A receiver that fails
    is logged: the host is registered all the same, and placement has its periodic pass."""
    def send() -> None:
        for receiver, result in host_available.send_robust(sender=Host, host=host):
            if isinstance(result, Exception):
                log.warning("host %s: %s failed on host_available: %s", host.name,
                            getattr(receiver, "__qualname__", receiver), result)

    transaction.on_commit(send)
    return host


def _database_now() -> datetime:
    """The database's clock: every host's beat is judged on one clock, whatever its own."""
    with connection.cursor() as cursor:
        cursor.execute(NOW_SQL.get(connection.vendor, "SELECT CURRENT_TIMESTAMP"))
        now = cursor.fetchone()[0]
    if isinstance(now, str):  # SQLite answers text, in UTC
        now = datetime.fromisoformat(now)
    return now if now.tzinfo else now.replace(tzinfo=UTC)
