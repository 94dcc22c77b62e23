"""An interface a lower app declares is answered by what the higher app provided once it is
ready; asked before, it names what is missing."""

import pytest

from common.provided import Provided
from jobs.mixtures import mixtures
from jobs.telemetry import telemetry


def test_what_is_asked_for_before_it_is_provided_is_named():
    sinks = Provided("metric sinks (the monitor app)")
    with pytest.raises(RuntimeError, match=r"no installed app provides metric sinks \(the mon"):
        sinks()
    provider = object()
    sinks.provide(provider)
    assert sinks() is provider


def test_the_higher_apps_provide_the_lower_ones_interfaces_when_ready():
    from datasets import mix
    from monitor import provided

    assert mixtures() is mix
    assert telemetry() is provided
