"""API latency: job reads with 1,000 jobs stored, under 20 concurrent clients.

    DATABASE_URL=postgresql://... .venv/bin/python -m bench.api_latency [--seconds 15]

The platform's web server as `manage.py serve` runs it (uvicorn, WEB_PROCESSES worker
processes; bench.platform_env), and side by side the one it ran before (daphne, one process),
over a database holding `--jobs` jobs of `--users` users, each job with its state history,
commands and checkpoints as a run leaves them. `--clients` clients, spread over the users, each
with its own API token and a kept-alive connection, read the job list (pages, state and name
filters, orderings), a job, its events, its checkpoints and its commands, in equal shares.

On each server, two phases of `--seconds` each (after a warm-up that is not counted):
- `paced`, the target's: each client pauses `--think-ms` (mean) between its requests, as a
  script or a page polling its jobs does; `met` says whether its p99 is within 50 ms with no
  error.
- `saturated`: no pause at all; its throughput is what the server serves here, and its
  latency is mostly the queue in front of it.
Prints one JSON document: per phase p50/p95/p99 per endpoint and overall, requests, errors and
throughput, with the machine's load average (the machine is shared) before and after.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import threading
import time
from collections import defaultdict
from datetime import timedelta

from bench.platform_env import Platform
from common.services import python_module, web_processes

TARGET_P99_MS = 50.0
PAGE = 20
STATES = ("queued", "running", "paused", "completed", "failed", "cancelled")
ENDPOINTS = ("list", "detail", "events", "checkpoints", "commands")


def seed(platform: Platform, jobs: int, users: int) -> dict[str, tuple[str, list[int]]]:
    """`jobs` jobs spread over `users` users (the platform's own user first), each with a
    state history, two commands and a few checkpoints; returns {username: (token, job ids)}."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from jobs.models import ApiToken, Checkpoint, Command, Job, JobEvent

    owners = [platform.user] + [
        get_user_model().objects.create_user(f"{platform.user.username}-{i}")
        for i in range(1, users)]
    tokens = {u.pk: ApiToken.objects.create(user=u, name="bench-latency").key for u in owners}
    spec = platform.job.spec
    rows = Job.objects.bulk_create([
        Job(name=f"run-{i:04d}", owner=owners[i % users], spec=spec, state=STATES[i % 6],
            step=i * 7 % 5000) for i in range(jobs)], batch_size=500)
    now = timezone.now()
    history = ("queued", "starting", "running", "pausing", "paused", "queued", "starting",
               "running")
    JobEvent.objects.bulk_create([
        JobEvent(job=job, from_state=a, to_state=b, cause="worker", actor="",
                 message=f"{a} -> {b}", time=now - timedelta(minutes=len(history) - k))
        for job in rows for k, (a, b) in enumerate(zip(history, history[1:], strict=False))],
        batch_size=2000)
    Command.objects.bulk_create([
        Command(job=job, kind=kind, args={}, state="done", requested_by="bench",
                cause="api_token", result={"by": "command"})
        for job in rows for kind in ("pause", "resume")], batch_size=2000)
    Checkpoint.objects.bulk_create([
        Checkpoint(job=job, seq=s, step=s * 100, time=float(s), tier="disk",
                   path=f"/runs/bench/{job.pk}/checkpoints/step-{s * 100:06d}",
                   size_bytes=256836096, strategy="NNG", world_size=4, blocking_s=0.04)
        for job in rows for s in range(1, 6)], batch_size=2000)
    return {u.username: (tokens[u.pk], [j.pk for j in rows if j.owner_id == u.pk])
            for u in owners}


def request_path(rng: random.Random, endpoint: str, job_ids: list[int]) -> str:
    if endpoint == "list":
        query = {"limit": PAGE, "offset": rng.randrange(0, len(job_ids), PAGE)}
        query.update(rng.choice([{}, {"state": rng.choice(STATES)}, {"name": "run-0"},
                                 {"ordering": "-step"}, {"state": "running", "ordering": "name"}]))
        return "/api/jobs/?" + "&".join(f"{k}={v}" for k, v in query.items())
    job = rng.choice(job_ids)
    return f"/api/jobs/{job}/" if endpoint == "detail" else f"/api/jobs/{job}/{endpoint}/"


class Client(threading.Thread):
    """One API user's script: a kept-alive connection, a request, a pause, the next one."""

    def __init__(self, port: int, token: str, job_ids: list[int], think_s: float, seed: int,
                 start_at: float, count_from: float, stop_at: float):
        super().__init__(daemon=True)
        self.port, self.token, self.job_ids, self.think_s = port, token, job_ids, think_s
        self.rng = random.Random(seed)
        self.start_at, self.count_from, self.stop_at = start_at, count_from, stop_at
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.errors: list[str] = []

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Authorization": f"Token {self.token}", "Accept": "application/json"}
        time.sleep(max(0.0, self.start_at - time.monotonic()))
        while (now := time.monotonic()) < self.stop_at:
            endpoint = self.rng.choice(ENDPOINTS)
            path = request_path(self.rng, endpoint, self.job_ids)
            started = time.perf_counter()
            try:
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                body = response.read()
                status = response.status
            except (OSError, http.client.HTTPException) as e:
                connection.close()
                status, body = 0, str(e).encode()
            elapsed_ms = (time.perf_counter() - started) * 1000
            if now >= self.count_from:
                if status == 200:
                    self.latencies[endpoint].append(elapsed_ms)
                else:
                    self.errors.append(f"{status} {path}: {body[:200]!r}")
            time.sleep(self.rng.uniform(0.5, 1.5) * self.think_s)
        connection.close()


def percentiles(values_ms: list[float]) -> dict[str, float | int]:
    cuts = statistics.quantiles(values_ms, n=100, method="inclusive")
    return {"n": len(values_ms), "p50": round(cuts[49], 2), "p95": round(cuts[94], 2),
            "p99": round(cuts[98], 2), "max": round(max(values_ms), 2)}


def phase(port: int, users: dict[str, tuple[str, list[int]]], args: argparse.Namespace,
          think_ms: float) -> dict:
    """Run the clients for one phase; their latencies per endpoint, errors and throughput."""
    start = time.monotonic() + 0.5
    owners = list(users.values())
    clients = [Client(port, *owners[i % len(owners)], think_ms / 1000, seed=i,
                      start_at=start, count_from=start + args.warmup,
                      stop_at=start + args.warmup + args.seconds)
               for i in range(args.clients)]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    per_endpoint = {e: [ms for c in clients for ms in c.latencies[e]] for e in ENDPOINTS}
    overall = [ms for values in per_endpoint.values() for ms in values]
    errors = [e for c in clients for e in c.errors]
    return {"think_ms": think_ms, "requests": len(overall), "errors": len(errors),
            "error_samples": errors[:5],
            "throughput_rps": round(len(overall) / args.seconds, 1),
            "latency_ms": {"overall": percentiles(overall),
                           **{e: percentiles(v) for e, v in per_endpoint.items()}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=15.0, help="measured, per phase")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds not counted")
    parser.add_argument("--think-ms", type=float, default=500.0,
                        help="mean pause of a client between its requests when paced")
    args = parser.parse_args()

    with Platform() as platform:
        try:
            report = measure(platform, args)
        finally:  # the platform removes its own user and jobs; these are the others
            from django.contrib.auth import get_user_model

            get_user_model().objects.filter(
                username__startswith=f"{platform.user.username}-").delete()
    print(json.dumps(report, indent=2))


def daphne(port: int) -> list[str]:
    """The server `serve` ran before it ran uvicorn: daphne, one process."""
    return python_module("daphne", "-b", "127.0.0.1", "-p", str(port),
                         "ringside.asgi:application")


def measure(platform: Platform, args: argparse.Namespace) -> dict:
    users = seed(platform, args.jobs, args.users)
    load_before = os.getloadavg()[0]
    servers = {}
    for name, command in ((f"uvicorn, {web_processes()} processes (as serve runs it)", None),
                          ("daphne, one process (before)", daphne)):
        port = int(platform.web(command, name=name.split(",")[0]).rsplit(":", 1)[1])
        servers[name] = {"paced": phase(port, users, args, args.think_ms),
                         "saturated": phase(port, users, args, 0.0)}
    ours, before = servers.values()
    p99 = ours["paced"]["latency_ms"]["overall"]["p99"]
    return {
        "bench": "api_latency",
        "database": platform.database,
        "jobs": args.jobs, "users": args.users, "clients": args.clients,
        "seconds_per_phase": args.seconds,
        "load_average_1m": {"before": round(load_before, 2),
                            "after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()},
        "servers": servers,
        "ratios": {
            "paced_p99_before_over_ours": round(
                before["paced"]["latency_ms"]["overall"]["p99"] / p99, 2),
            "saturated_throughput_ours_over_before": round(
                ours["saturated"]["throughput_rps"] / before["saturated"]["throughput_rps"], 2),
        },
        "target": {"p99_ms": TARGET_P99_MS, "phase": "paced", "server": "as serve runs it"},
        "met": ours["paced"]["errors"] == 0 and p99 <= TARGET_P99_MS,
    }


if __name__ == "__main__":
    main()
