"""hosts.registry: a worker registers its host (upsert by name), beats it on the database's
clock, and is refused a name another live worker holds; a lost or dead holder's name is taken
over. Devices, slots and the address come from this machine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta

import psutil
import pytest
from django.utils import timezone

from hosts import registry
from hosts.models import Host
from hosts.registry import HostInfo, HostNameTaken, HostTakenOver
from hosts.signals import host_available

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("session_worker_host_hidden")]


def info(name: str = "h1", **fields) -> HostInfo:
    found = {"cpu": {"cores": 4, "memory_bytes": 2**33}, "gpus": []}
    return HostInfo(**{"name": name, "address": "10.0.0.1", "devices": found, "slots": 8,
                       "version": registry.version(), **fields})


def age(host: Host, seconds: float) -> None:
    Host.objects.filter(pk=host.pk).update(beat_at=timezone.now() - timedelta(seconds=seconds))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not psutil.pid_exists(proc.pid)
    return proc.pid


def test_register_creates_the_host_and_a_second_start_of_the_same_worker_updates_it():
    first = info(labels={"rack": "a"})
    host = registry.register(first)
    assert (host.name, host.address, host.slots, host.labels) == ("h1", "10.0.0.1", 8,
                                                                  {"rack": "a"})
    assert host.state == "up" and host.queue == "host.h1" and not host.is_lost
    again = registry.register(HostInfo(**{**first.__dict__, "address": "10.0.0.9"}))
    assert again.pk == host.pk and Host.objects.get().address == "10.0.0.9"


def test_a_name_held_by_another_live_worker_is_refused_naming_the_setting():
    registry.register(info())
    with pytest.raises(HostNameTaken, match="RINGSIDE_HOST_NAME: host 'h1' is held by another "
                                            "live worker .*at 10.0.0.1"):
        registry.register(info(address="10.0.0.2"))
    assert Host.objects.get().address == "10.0.0.1"


def test_a_lost_holders_name_is_taken_over_and_drained_stays_as_staff_set_it():
    old = registry.register(info())
    registry.set_drained(old, True, "staff")
    age(old, 31)
    assert Host.objects.get().state == "lost"
    new = registry.register(info(address="10.0.0.2"))
    assert new.pk == old.pk and new.instance != old.instance and new.drained
    assert new.state == "drained"


def test_a_live_holder_whose_process_on_this_machine_is_gone_is_taken_over_at_once():
    registry.register(info(instance=f"{socket.gethostname()}:{dead_pid()}:0"))
    assert registry.register(info(address="10.0.0.2")).address == "10.0.0.2"
    # the holder now is this process, alive: it keeps its name
    assert Host.objects.get().instance.startswith(f"{socket.gethostname()}:{os.getpid()}:")
    with pytest.raises(HostNameTaken):
        registry.register(info(address="10.0.0.3"))


def test_a_beat_moves_beat_at_on_the_database_clock_and_records_the_clock_offset():
    host = registry.register(info())
    age(host, 20)
    host.refresh_from_db()
    before = host.beat_at
    registry.beat(host)
    stored = Host.objects.get()
    assert stored.beat_at > before + timedelta(seconds=19)
    # one machine: the worker's clock is the database's, to well within a second
    assert abs(stored.clock_offset_s) < 0.5 and stored.clock_offset_s == host.clock_offset_s


def test_a_worker_whose_name_was_taken_over_while_it_was_lost_is_told_at_its_next_beat():
    old = registry.register(info())
    age(old, 31)
    registry.register(info(address="10.0.0.2"))
    with pytest.raises(HostTakenOver, match="registered by another worker"):
        registry.beat(old)


def test_up_is_beating_and_not_drained():
    fresh, lost, drained = (registry.register(info(name)) for name in ("a", "b", "c"))
    age(lost, 31)
    registry.set_drained(drained, True, "staff")
    assert [h.name for h in Host.objects.up()] == ["a"]
    assert [h.name for h in Host.objects.live()] == ["a", "c"]
    assert Host.objects.get(name="b").is_lost and Host.objects.get(name="c").state == "drained"


def test_slots_are_one_per_gpu_else_worker_slots_else_the_cores_but_at_least_8(settings):
    gpus = [{"name": "H100", "memory_bytes": 80 * 2**30}] * 2
    assert registry.slots_for({"cpu": {"cores": 64}, "gpus": gpus}) == 2
    settings.WORKER_SLOTS = None
    assert registry.slots_for({"cpu": {"cores": 2}, "gpus": []}) == 8
    assert registry.slots_for({"cpu": {"cores": 32}, "gpus": []}) == 32
    settings.WORKER_SLOTS = 3
    assert registry.slots_for({"cpu": {"cores": 32}, "gpus": []}) == 3


def test_this_host_reads_this_machines_devices_name_address_and_version(settings):
    settings.RINGSIDE_HOST_NAME, settings.RINGSIDE_HOST_ADDRESS = "box", ""
    settings.WORKER_LABELS = {"zone": "z1"}
    settings.REDIS_URL = "redis://127.0.0.1:6399/0"
    me = registry.this_host()
    assert me.name == "box" and me.labels == {"zone": "z1"}
    assert me.address == "127.0.0.1"  # the interface that reaches Redis: loopback here
    assert me.devices["cpu"] == {"cores": psutil.cpu_count(),
                                 "memory_bytes": psutil.virtual_memory().total}
    assert me.version.startswith("0.") and me.instance.startswith(socket.gethostname() + ":")
    settings.RINGSIDE_HOST_ADDRESS = "10.1.2.3"
    assert registry.host_address() == "10.1.2.3"


def test_a_beat_registers_again_a_host_whose_row_was_deleted():
    host = registry.register(info(labels={"rack": "a"}))
    Host.objects.all().delete()  # a flushed database, a row deleted by hand
    registry.beat(host)
    again = Host.objects.get()
    assert (again.name, again.instance, again.labels, again.state) == (
        "h1", host.instance, {"rack": "a"}, "up")
    registry.beat(again)
    assert Host.objects.count() == 1


def test_host_available_is_sent_when_a_host_can_take_placements_it_could_not_before(
        django_capture_on_commit_callbacks):
    told: list[str] = []

    def receiver(sender, host, **kwargs) -> None:
        told.append(host.name)

    host_available.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            host = registry.register(info())  # new
            registry.beat(host)  # an ordinary beat: nothing new
            registry.set_drained(host, True, "staff")
        assert told == ["h1"]
        with django_capture_on_commit_callbacks(execute=True):
            registry.set_drained(host, False, "staff")  # undrained
            host.beat_at -= timedelta(seconds=31)
            registry.beat(host)  # back after being lost
            Host.objects.all().delete()
            registry.beat(host)  # its row re-created
        assert told == ["h1"] * 4
    finally:
        host_available.disconnect(receiver)
