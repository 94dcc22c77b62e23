"""Prometheus text exposition (format 0.0.4) of the latest aggregates, and a tiny server.

    server = MetricsServer(port=9400, job="run-1").start()   # rank 0, when asked
    server.update(aggregate)                                  # after each OpAggregator call
    # GET http://host:9400/metrics

Gauges per op (across ranks), per op and rank, and per rank, so an existing Grafana can
scrape a running job the way DLRover scrapes XPUTimer's /metrics.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_OP_GAUGES = (
    ("op_total_ms", "total_ms", "Mean over ranks of the time spent in the op in the last step"),
    ("op_max_ms", "max_ms", "Largest per-rank time in the op in the last step"),
    ("op_median_ms", "median_ms", "Median per-rank time in the op in the last step"),
    ("op_calls", "count", "Calls of the op per rank in the last step"),
    ("op_slowest_rank", "slowest_rank", "Rank that spent the longest in the op"),
    ("op_tflops", "tflops", "Achieved TFLOP/s of a matmul op (median rank)"),
    ("op_busbw_gbps", "busbw_gbps", "Bus bandwidth of a collective in Gbit/s (median rank)"),
    ("op_bytes", "bytes", "Bytes a collective moved per rank in the last step"),
)
_RANK_GAUGES = (
    ("rank_step_ms", "step_ms", "Step wall time per rank"),
    ("rank_compute_ms", "compute_ms", "Step time outside collectives and data wait per rank"),
    ("rank_comm_ms", "comm_ms", "Time in collectives per rank, peer wait included"),
    ("rank_data_ms", "data_ms", "Time waiting for data per rank"),
    ("rank_void_share", "void_share", "Share of step time not covered by timed ops per rank"),
)


def _label(value: Any) -> str:
    return str(value).replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


def labels(**pairs: Any) -> str:
    """A sample's label set, `{k="v",...}`, its values escaped (the platform's goodput gauges
    use it too)."""
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in pairs.items()) + "}"


def render_prometheus(aggregate: dict[str, Any], job: str = "", prefix: str = "ringside_") -> str:
    """Exposition text for one `OpAggregator.aggregate` result."""
    lines: list[str] = []

    def family(name: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        if not samples:
            return
        lines.append(f"# HELP {prefix}{name} {help_text}")
        lines.append(f"# TYPE {prefix}{name} gauge")
        lines.extend(f"{prefix}{name}{label_set} {float(value)!r}" for label_set, value in samples)

    family("step", "Last step aggregated", [(labels(job=job), aggregate["step"])])
    family("step_ms", "Slowest rank's step time", [(labels(job=job), aggregate["step_ms"])])
    ops = aggregate["ops"]
    for metric, key, help_text in _OP_GAUGES:
        family(metric, help_text, [
            (labels(job=job, op=name, kind=op["kind"], group=op.get("group", "")), op[key])
            for name, op in sorted(ops.items()) if key in op])
    family("op_rank_ms", "Time spent in the op per rank in the last step", [
        (labels(job=job, op=name, rank=row["rank"]), ms)
        for name, op in sorted(ops.items())
        for row, ms in zip(aggregate["ranks"], op["per_rank_ms"], strict=True)])
    for metric, key, help_text in _RANK_GAUGES:
        family(metric, help_text, [(labels(job=job, rank=row["rank"]), row[key])
                                   for row in aggregate["ranks"]])
    return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves the latest rendered aggregate at /metrics from a daemon thread."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", job: str = ""):
        self.job = job
        self._text = ""
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served")
                    return
                with server._lock:
                    body = server._text.encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass  # scrapes every few seconds would flood the job's log

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="metrics-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/metrics"

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def update(self, aggregate: dict[str, Any]) -> None:
        text = render_prometheus(aggregate, self.job)
        with self._lock:
            self._text = text

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
