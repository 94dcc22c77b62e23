"""What the platform benchmarks share: the platform's real parts, started as `manage.py serve`
starts them, and events shaped like the engine's.

`Platform` starts a private redis-server (as `serve` does when REDIS_URL is unset), sets Django
up against DATABASE_URL (PostgreSQL; unset: a SQLite file of the benchmark's own), migrates,
and creates a user with an API token and a job for the benchmark; on exit it deletes them
(and vacuums the tables they filled, on PostgreSQL) and stops everything it started. `web()`
starts the ASGI server (uvicorn) and `ingest(job)` runs `manage.py ingest` for a job, each as
a subprocess against the same Redis and database.

`engine_events` yields what rank 0 of a `tiny` run on 2x2 ranks publishes: per step a `step`,
an `experts` (one entry per MoE layer, tokens for every expert) and an `ops` event (every timed
op of the model with per-rank times), a `checkpoint` every 5th step and a loss-spike `anomaly`
with the fault policy's `action` every 10th; publish them with the engine's own `EventLog`.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
# Chromium as the browser tests and benchmarks drive it (headless, in a container)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
if str(REPO_ROOT / "platform") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "platform"))

from common.services import (  # noqa: E402 (the platform's packages are on the path now)
    child_env,
    redis_server_command,
    stop_process_group,
    wait_for_port,
    web_processes,
    web_server_command,
)
from engine.ports import free_port  # noqa: E402

PASSWORD = "bench-password-1"


def chromium_path() -> str | None:
    """A Chromium on this machine (CHROMIUM, else Debian's); None: Playwright's own."""
    for candidate in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser",
                      shutil.which("chromium")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def open_logged_in(playwright: Any, base_url: str, username: str) -> Any:
    """A laptop-sized page of a new headless Chromium, logged in to the platform at
    `base_url` through its login form (its browser: `page.context.browser`)."""
    browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.goto(f"{base_url}/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Log in')")
    page.wait_for_selector("h1:has-text('Jobs')")
    return page


class Platform:
    """Redis, the database and Django for one benchmark run (a context manager)."""

    def __enter__(self) -> Platform:
        self.tmp = Path(tempfile.mkdtemp(prefix="ringside-bench-"))
        self.procs: list[subprocess.Popen] = []
        redis_port = free_port()
        self._start(redis_server_command(redis_port, self.tmp / "redis"), "redis")
        wait_for_port(redis_port, 15, self.procs[-1])
        self.redis_url = f"redis://127.0.0.1:{redis_port}/0"
        self.database_url = os.environ.get("DATABASE_URL") or \
            f"sqlite:///{self.tmp / 'bench.sqlite3'}"
        os.environ.update(child_env(REDIS_URL=self.redis_url, DATABASE_URL=self.database_url,
                                    LOG_LEVEL="WARNING"))
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        from jobs.models import ApiToken

        call_command("migrate", interactive=False, verbosity=0)
        self.database = connection.vendor  # "postgresql" or "sqlite"
        from django.contrib.auth import get_user_model

        self.user = get_user_model().objects.create_user(f"bench-{os.getpid()}-{redis_port}",
                                                         password=PASSWORD)
        self.token = ApiToken.objects.create(user=self.user, name="bench").key
        self.job = self.new_job()
        return self

    def new_job(self):
        """A running job of the benchmark's user (its stream is empty)."""
        from jobs.models import Job

        return Job.objects.create(name="bench", owner=self.user, state="running",
                                  spec={"name": "bench", "model": {"preset": "tiny"},
                                        "train": {"steps": 1_000_000}})

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            stop_process_group(proc)
        self.user.delete()  # its token, its job and everything stored for the job
        if self.database == "postgresql":
            # the dead rows of this run would otherwise slow the next run's inserts until
            # autovacuum comes by (a run after a dozen others stored 4,500 events/s, one on a
            # fresh database 6,000-7,000)
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE monitor_event, monitor_metricpoint, "
                               "monitor_opssample, monitor_expertload")
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _start(self, argv: list[str], name: str) -> subprocess.Popen:
        log = (self.tmp / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=child_env(), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def web(self, command: Callable[[int], list[str]] | None = None, name: str = "web") -> str:
        """Start the ASGI server as `serve` runs it (or as `command(port)` says); its base
        URL."""
        port = free_port()
        argv = command(port) if command else web_server_command("127.0.0.1", port,
                                                                web_processes())
        proc = self._start(argv, name)
        wait_for_port(port, 60, proc)
        return f"http://127.0.0.1:{port}"

    def ingest(self, job_id: int) -> None:
        """Start `manage.py ingest JOB`; returns once its consumer group exists (it reads)."""
        import redis

        from engine.runtime.events import events_stream

        proc = self._start([sys.executable, "manage.py", "ingest", str(job_id)], "ingest")
        client = redis.Redis.from_url(self.redis_url)
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"manage.py ingest exited with {proc.returncode}: "
                                   f"{self.log('ingest')[-2000:]}")
            if client.exists(events_stream(str(job_id))):
                client.close()
                return
            time.sleep(0.05)
        raise TimeoutError("manage.py ingest did not create its consumer group in 30 s")

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")


def _op_names(num_layers: int, first_dense: int, mtp_layers: int) -> list[str]:
    """The ops the engine times in one step of the model (as in a real `tiny` run's events)."""
    def block(prefix: str, moe: bool) -> list[str]:
        ffn = [f"{prefix}ffn.experts", f"{prefix}ffn.router", f"{prefix}ffn.shared"] if moe \
            else [f"{prefix}ffn"]
        return [f"{prefix}attention", f"{prefix}attention.key_norm",
                f"{prefix}attention.query_norm", f"{prefix}attention_norm", f"{prefix}ffn_norm",
                *ffn]

    names = ["backward", "checkpoint", "data", "fault_agreement", "forward",
             "forward_backward", "grad_norm.global", "lm_head", "metrics_all_reduce", "norm",
             "optimizer", "worst_all_reduce"]
    for i in range(num_layers):
        names += block(f"layers.{i}.", moe=i >= first_dense)
    for i in range(mtp_layers):
        names += [*block(f"mtp.{i}.block.", moe=True), f"mtp.{i}.embed_norm",
                  f"mtp.{i}.final_norm", f"mtp.{i}.hidden_norm"]
    return sorted(names)


COLLECTIVES = ("all_gather.inter", "all_gather.intra", "reduce_scatter.inter",
               "reduce_scatter.intra")


def engine_events(world_size: int = 4, seed: int = 0) -> Iterator[tuple[str, int, dict]]:
    """(type, step, fields) of a `tiny` run on `world_size` ranks, step 1 onwards, forever."""
    from engine.moe.config import preset

    config = preset("tiny")
    rng = random.Random(seed)
    ops = _op_names(config.num_hidden_layers, config.first_k_dense_replace,
                    config.num_nextn_predict_layers)
    moe_layers = config.num_hidden_layers - config.first_k_dense_replace + \
        config.num_nextn_predict_layers
    tokens_per_step = 4 * 128 * world_size
    step = 0
    while True:
        step += 1
        step_ms = rng.uniform(900, 1300)
        loss = 5.5 / (1 + step / 500) + rng.gauss(0, 0.05)
        yield "step", step, {
            "loss": loss, "grad_norm": rng.uniform(0.5, 9), "lr": 2e-4,
            "tokens_per_s": tokens_per_step / step_ms * 1000, "step_time": step_ms / 1000,
            "tokens": tokens_per_step * step, "memory": {"rss_bytes": rng.randint(9e8, 1.1e9)},
            "state_bytes": {"params": 85612032, "grads": 85612032, "optim": 42806016},
            "comm": {"intra_bytes": 85612032, "inter_bytes": 42806016, "intra_calls": 2,
                     "inter_calls": 2}}
        yield "experts", step, {"layers": [_expert_layer(rng, config.num_experts,
                                                         tokens_per_step * 4)
                                           for _ in range(moe_layers)]}
        yield "ops", step, _ops_fields(rng, ops, world_size, step_ms)
        if step % 5 == 0:
            yield "checkpoint", step, {
                "path": f"/runs/bench/checkpoints/step-{step:06d}", "tier": "disk",
                "blocking_s": rng.uniform(0.02, 0.06), "size_bytes": 256836096,
                "strategy": "NNG", "world_size": world_size}
        if step % 10 == 0:
            yield "anomaly", step, {
                "kind": "loss_spike", "severity": "warning", "rank": rng.randrange(world_size),
                "evidence": {"value": loss * 8, "ewma_mean": loss, "ewma_std": 0.7, "z": 40.4,
                             "z_threshold": 3.0, "min_rise": 0.25, "max_seen": 5.6,
                             "max_factor": 10.0, "rule": "ewma_z", "flagged_in_a_row": 1,
                             "wide": False}}
            yield "action", step, {"action": "skip_update", "anomaly": "loss_spike", "rung": 0,
                                   "rank": 1, "by": "policy", "reason": "first occurrence"}


def _expert_layer(rng: random.Random, experts: int, tokens: int) -> dict[str, Any]:
    weights = [rng.expovariate(1.0) for _ in range(experts)]
    scale = tokens / sum(weights)
    counts = [int(w * scale) for w in weights]
    return {"tokens_per_expert": counts, "max_violation": max(counts) / (tokens / experts) - 1,
            "dead_experts": counts.count(0), "load_entropy": rng.uniform(0.7, 0.95),
            "z_loss": rng.uniform(15, 18), "router_logit_max": rng.uniform(1, 1.3),
            "expert_bias": {"mean": 0.0, "std": rng.uniform(0.005, 0.01),
                            "absmax": rng.uniform(0.01, 0.02)}}


def _ops_fields(rng: random.Random, names: list[str], world_size: int,
                step_ms: float) -> dict[str, Any]:
    """An `ops` event body with the engine's precision (engine.xputimer.aggregate)."""
    from engine.xputimer.aggregate import to_ppm, to_us

    ops = {}
    for name in names:
        per_rank = [to_us(rng.uniform(0.1, 60)) for _ in range(world_size)]
        ordered = sorted(per_rank)
        median = statistics.median(per_rank)
        entry = {"kind": "collective" if name in COLLECTIVES else "compute", "count": 1,
                 "total_ms": to_us(sum(per_rank) / world_size), "mean_ms": to_us(median),
                 "min_ms": ordered[0], "median_ms": to_us(median), "max_ms": ordered[-1],
                 "max_call_ms": ordered[-1], "slowest_rank": per_rank.index(ordered[-1]),
                 "per_rank_ms": per_rank}
        if name in COLLECTIVES:
            collective, group = name.split(".")
            entry.update(bytes=42806016, group=group, algo="ring", collective=collective,
                         busbw_gbps=rng.uniform(0.5, 5))
        ops[name] = entry
    ranks = [{"rank": r, "step_ms": to_us(step_ms - rng.uniform(0, 5)),
              "compute_ms": to_us(step_ms * 0.55), "comm_ms": to_us(step_ms * 0.44),
              "data_ms": to_us(rng.uniform(0.1, 0.3)), "void_share": to_ppm(rng.uniform(0, 0.02))}
             for r in range(world_size)]
    return {"step_ms": to_us(step_ms), "void_share": to_ppm(rng.uniform(0, 0.02)),
            "data_wait_share": to_ppm(rng.uniform(0, 0.001)), "ops": ops, "ranks": ranks}


def distribution(values_ms: list[float]) -> dict[str, float | int]:
    """Count, mean and the percentiles (p50, p90, p99, max) of some delays in ms."""
    ordered = sorted(values_ms)
    if not ordered:
        return {"n": 0}

    def at(share: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 2)

    return {"n": len(ordered), "mean": round(statistics.fmean(ordered), 2), "p50": at(0.50),
            "p90": at(0.90), "p99": at(0.99), "max": round(ordered[-1], 2)}
