"""Worker hosts on the one-machine cluster (tests/platform/cluster.py): three real workers,
each in its own network namespace at its own address, register; a killed one turns lost
after HOST_LOST_AFTER_S while the others beat on; a host whose link is cut turns lost and
comes back up when the link does. Needs root."""

from __future__ import annotations

import pytest
from django.db import connection

from hosts.models import Host
from tests.platform.services import WORKER_STARTED

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("session_worker_host_drained")]

FAST = {"HOST_BEAT_S": "0.5", "HOST_LOST_AFTER_S": "3", "WORKER_SLOTS": "2",
        "WORKER_CONCURRENCY": "1"}


def states() -> dict[str, str]:
    """The cluster's hosts' states (the session's worker host may be registered too)."""
    return {host.name: host.state for host in Host.objects.exclude(name__in=WORKER_STARTED)}


def test_three_hosts_register_and_a_killed_one_turns_lost(host_cluster, eventually, settings):
    settings.HOST_LOST_AFTER_S = 3.0
    cluster = host_cluster(3, **FAST)
    names = [host.name for host in cluster.hosts]
    eventually(lambda: states() == dict.fromkeys(names, "up"), 120,
               "three hosts register: " + cluster.log_tail(0))
    registered = Host.objects.exclude(name__in=WORKER_STARTED)
    assert {h.name: (h.address, h.slots) for h in registered} == {
        host.name: (host.address, 2) for host in cluster.hosts}
    assert len({h.address for h in registered}) == 3  # each at its own address

    cluster.kill(1)
    eventually(lambda: states()[names[1]] == "lost", 15, "the killed host turns lost")
    assert states() == {names[0]: "up", names[1]: "lost", names[2]: "up"}
    assert sorted(Host.objects.up().values_list("name", flat=True)) == [names[0], names[2]]

    joined = cluster.grow(1)[0]  # a fourth host joins, reaching the services like the others
    eventually(lambda: states().get(joined.name) == "up", 120,
               "the new host registers: " + cluster.log_tail(3))
    assert Host.objects.get(name=joined.name).address == joined.address


def test_a_cut_host_turns_lost_and_comes_back_with_its_link(host_cluster, eventually,
                                                           settings):
    if connection.vendor != "postgresql":
        pytest.skip("a cut link stops a host's beat only where the database is reached over "
                    "the network: set DATABASE_URL to PostgreSQL")
    settings.HOST_LOST_AFTER_S = 3.0
    cluster = host_cluster(2, **FAST)
    names = [host.name for host in cluster.hosts]
    eventually(lambda: states() == dict.fromkeys(names, "up"), 120, "two hosts register")
    cluster.cut(0)
    eventually(lambda: states()[names[0]] == "lost", 15, "the cut host turns lost")
    assert states()[names[1]] == "up"
    cluster.restore(0)
    eventually(lambda: states()[names[0]] == "up", 90,
               "the host beats again once its link is back: " + cluster.log_tail(0))
