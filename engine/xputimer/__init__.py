"""Per-op timing (XPUTimer style): explicit op timers, cross-rank aggregation, hang watchdog,
Chrome-trace export and a Prometheus endpoint. See timer.py for the per-step usage."""

from engine.xputimer.aggregate import OpAggregator
from engine.xputimer.hooks import time_modules
from engine.xputimer.prometheus import MetricsServer, render_prometheus
from engine.xputimer.timer import COLLECTIVES, KINDS, OpStats, OpTimer, StepTimings, bus_factor
from engine.xputimer.trace import chrome_trace, rank_timeline, write_trace
from engine.xputimer.watchdog import DEFAULT_TIMEOUT_S, HangWatchdog

__all__ = [
    "COLLECTIVES", "DEFAULT_TIMEOUT_S", "KINDS", "HangWatchdog", "MetricsServer", "OpAggregator",
    "OpStats", "OpTimer", "StepTimings", "bus_factor", "chrome_trace", "rank_timeline",
    "render_prometheus", "time_modules", "write_trace",
]
