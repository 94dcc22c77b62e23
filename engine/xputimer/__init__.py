"""Per-op timing (XPUTimer style): explicit op timers, cross-rank aggregation, hang watchdog,
Chrome-trace export and a Prometheus endpoint. See timer.py for the per-step usage."""

from engine.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "aggregate": ("OpAggregator",),
    "hooks": ("time_modules",),
    "prometheus": ("MetricsServer", "render_prometheus"),
    "timer": ("COLLECTIVES", "KINDS", "OpStats", "OpTimer", "StepTimings", "bus_factor"),
    "trace": ("chrome_trace", "rank_timeline", "write_trace"),
    "watchdog": ("DEFAULT_TIMEOUT_S", "HangWatchdog"),
})
