"""What a job's metric sinks cost its training: step time with TensorBoard, MLflow and W&B on,
over none.

    .venv/bin/python -m bench.sinks [--preset nano] [--block-s 6] [--rounds 8]

The engine's own `Trainer` trains on one CPU rank in a process of its own and publishes its
events to the job's Redis stream (as rank 0 does); this process plays the job's supervisor,
where the sinks run: a thread per sink polls its `SinkConsumer` (monitor.sinks.consumer) every
RINGSIDE_SINK_INTERVAL_S as the supervisor's `SinkRunner` does, the
TensorBoard sink into event files, the MLflow sink into a real tracking server started here
(`mlflow server`, SQLite), the W&B sink offline. Blocks take turns with the sinks on and off
(the order rotates each round, so drift falls on both alike). A block lasts `--block-s`
seconds (its steps counted from the warm-up's step time): several of the sinks' polling
intervals, so that an "on" block holds the sinks' steady work rather than one poll. Between
blocks the trainer waits until the sinks caught up with what it published, so an "on" block's sink
work is its own steps'. `sink_overhead` is the median step time of the "on" blocks over that
of the "off" ones, minus one, in wall-clock time (the sinks cost the trainer only through the
machine they share), with the standard error of the "off" blocks that says what it can
resolve. `sink_cpu_per_step_time` accounts for it from the other side: the CPU time the sinks
spent per step while on over a step's time, what they would cost a trainer on the same core
(on a machine with a core to spare they cost it nothing); `sinks_cpu_ms_per_step_by_part`
splits it: each sink's thread, and what the MLflow server, W&B's service and Redis spent more
per step with the sinks on than off. The sinks' threads run at monitor.sinks.consumer's
SINK_NICENESS, as the supervisor's do. Target (issue 36): <= 0.01. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from engine.ports import free_port

TARGET = 0.01
WARM_STEPS = 10  # timed after the warm-up, to size the blocks
MIN_BLOCK_STEPS = 20
MODES = ("off", "on")


def engine_main(args: argparse.Namespace, job_id: str, bus_url: str, run_dir: str,
                conn) -> None:
    """The trainer: a block of steps at each word from the supervisor, its mean step time
    back."""
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    from engine.runtime.events import EventLog
    from engine.runtime.spec import parse_spec
    from engine.runtime.train import Trainer

    spec = {"name": "sinks", "model": {"preset": args.preset},
            "train": {"steps": 100_000, "micro_batch": 2, "seq_len": 64, "eval_every": 0,
                      "threads": 1},
            "checkpoint": {"every": 0}}
    trainer = Trainer(parse_spec(spec), Path(run_dir),
                      events=EventLog(job_id, bus_url=bus_url))
    for _ in range(3):  # warm-up: allocator, first-call costs
        trainer.train_step()
    started = time.perf_counter()
    for _ in range(WARM_STEPS):
        trainer.train_step()
    conn.send((time.perf_counter() - started) / WARM_STEPS)
    while (word := conn.recv())[0] == "block":
        started = time.perf_counter()
        for _ in range(word[1]):
            trainer.train_step()
        conn.send((time.perf_counter() - started) / word[1])
    trainer.finish()


class SinkThreads:
    """The job's three sinks, each on a thread of its own (its tracker opened there, as
    SinkRunner opens it), polled while `on` is set."""

    def __init__(self, sinks: list, redis_url: str):
        import redis

        from monitor.sinks.consumer import SinkConsumer

        self.on = threading.Event()
        self.done = False
        self.cpu_lock = threading.Lock()
        self.cpu_s = {sink.kind: 0.0 for sink in sinks}  # each sink's thread's, while on
        self.consumers = [SinkConsumer(sink, redis.Redis.from_url(redis_url)) for sink in sinks]
        # a consumer is polled by its thread, or between blocks by `catch_up`: never by both
        self.locks = [threading.Lock() for _ in sinks]
        self.opened = threading.Barrier(len(sinks) + 1)
        self.threads = [threading.Thread(target=self._follow, args=(c, lock), daemon=True)
                        for c, lock in zip(self.consumers, self.locks, strict=True)]
        for thread in self.threads:
            thread.start()
        self.opened.wait()

    def _follow(self, consumer, lock: threading.Lock) -> None:
        from django.conf import settings

        from monitor.sinks.consumer import yield_to_training

        yield_to_training()  # as SinkRunner does
        while consumer.poll():  # the trackers opened (the W&B run, the MLflow run) untimed
            pass
        self.opened.wait()
        while not self.done:
            if self.on.wait(0.1):
                started = time.thread_time()
                with lock:
                    consumer.poll(block_ms=100)
                with self.cpu_lock:
                    self.cpu_s[consumer.sink.kind] += time.thread_time() - started
                time.sleep(settings.RINGSIDE_SINK_INTERVAL_S)  # as SinkRunner writes

    def catch_up(self) -> None:
        """Write what is left (the sinks off: the trainer waits meanwhile)."""
        for consumer, lock in zip(self.consumers, self.locks, strict=True):
            with lock:
                while consumer.poll():
                    pass

    def close(self) -> None:
        self.done = True
        self.on.clear()
        for thread in self.threads:
            thread.join()
        for consumer in self.consumers:
            consumer.close()


def start_mlflow(folder: Path) -> tuple[subprocess.Popen, str]:
    from common.services import wait_for_port

    port = free_port()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
         f"sqlite:///{folder}/mlflow.db", "--default-artifact-root", str(folder / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    wait_for_port(port, 600, proc)
    return proc, f"http://127.0.0.1:{port}"


def measure(args: argparse.Namespace, platform, tracking_uri: str, mlflow_pid: int) -> dict:
    from django.conf import settings

    from monitor.sinks.models import Sink, SinkKind

    settings.RINGSIDE_MLFLOW_TRACKING_URI = tracking_uri
    job = platform.job
    sinks = [Sink.objects.create(job=job, kind=SinkKind.TENSORBOARD),
             Sink.objects.create(job=job, kind=SinkKind.MLFLOW,
                                 config={"kind": "mlflow", "experiment": "bench"}),
             Sink.objects.create(job=job, kind=SinkKind.WANDB,
                                 config={"kind": "wandb", "mode": "offline", "project": "bench"})]
    here, there = mp.get_context("spawn").Pipe()
    engine = mp.get_context("spawn").Process(
        target=engine_main, args=(args, str(job.pk), platform.redis_url,
                                  str(platform.tmp / "engine"), there))
    engine.start()
    block = max(MIN_BLOCK_STEPS, round(args.block_s / here.recv()))
    threads = SinkThreads(sinks, platform.redis_url)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    shared = shared_processes(platform, mlflow_pid)
    shared_cpu_s = {mode: dict.fromkeys(shared, 0.0) for mode in MODES}
    try:
        for r in range(args.rounds):
            for mode in MODES[r % 2:] + MODES[: r % 2]:
                if mode == "on":
                    threads.on.set()
                before = {name: cpu_seconds(procs) for name, procs in shared.items()}
                here.send(("block", block))
                times[mode].append(here.recv())
                threads.on.clear()
                for name, procs in shared.items():
                    shared_cpu_s[mode][name] += cpu_seconds(procs) - before[name]
                threads.catch_up()
    finally:
        here.send(("stop",))
        engine.join(60)
        threads.close()
    steps = block * args.rounds  # of each mode
    # a shared process's part: what it spent more with the sinks on than off
    by_part = {f"{kind} sink": cpu / steps for kind, cpu in threads.cpu_s.items()}
    by_part |= {name: (shared_cpu_s["on"][name] - shared_cpu_s["off"][name]) / steps
                for name in shared}
    return {"times": times, "steps_per_block": block, "cpu_s_per_step": by_part}


def shared_processes(platform, mlflow_pid: int) -> dict[str, list]:
    """The processes the sinks keep busy besides their threads: the MLflow server (and its
    workers), W&B's service (a child of this process) and Redis, which the trainer uses too."""
    import psutil

    mlflow = psutil.Process(mlflow_pid)
    ours = psutil.Process().children(recursive=True)
    return {"mlflow server": [mlflow, *mlflow.children(recursive=True)],
            "wandb service": [p for p in ours if "wandb" in " ".join(p.cmdline())],
            "redis": [psutil.Process(platform.procs[0].pid)]}


def cpu_seconds(processes: list) -> float:
    import psutil

    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="nano")
    parser.add_argument("--block-s", type=float, default=6.0,
                        help="seconds of training per block (3 of the sinks' 2 s intervals)")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("RUNS_DIR", tempfile.mkdtemp(prefix="ringside-bench-runs-"))
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    from bench.platform_env import Platform
    from common.services import stop_process_group

    with Platform() as platform:
        mlflow, tracking_uri = start_mlflow(platform.tmp)
        try:
            measured = measure(args, platform, tracking_uri, mlflow.pid)
        finally:
            stop_process_group(mlflow, grace_s=5)
    times = measured["times"]
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    overhead = on / off - 1
    # what the comparison can resolve: the spread of the blocks without sinks
    noise = statistics.stdev(times["off"]) / off / len(times["off"]) ** 0.5
    cpu_s_per_step = sum(measured["cpu_s_per_step"].values())
    accounted = cpu_s_per_step / off
    print(json.dumps({
        "benchmark": "sinks", "preset": args.preset, "steps_per_block": measured["steps_per_block"],
        "rounds": args.rounds, "sinks": ["tensorboard", "mlflow", "wandb (offline)"],
        "step_s": {mode: [round(t, 5) for t in ts] for mode, ts in times.items()},
        "median_step_s": {"off": round(off, 5), "on": round(on, 5)},
        "standard_error": round(noise, 4),
        "sinks_cpu_s_per_step": round(cpu_s_per_step, 5),
        "sinks_cpu_ms_per_step_by_part": {name: round(cpu * 1000, 3) for name, cpu
                                           in measured["cpu_s_per_step"].items()},
        "ratios": {"sink_overhead": round(overhead, 4),
                   "sink_cpu_per_step_time": round(accounted, 4)},
        "target": {"sink_overhead": TARGET}, "meets_target": overhead <= TARGET,
    }, indent=2))


if __name__ == "__main__":
    main()
