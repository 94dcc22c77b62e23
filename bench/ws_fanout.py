"""Websocket fan-out: many browsers watching one job, each must get every event, promptly.

    DATABASE_URL=postgresql://... .venv/bin/python -m bench.ws_fanout [--clients 50]
                                                                      [--rate 20] [--seconds 15]

The platform's real parts as `manage.py serve` runs them: the web server (uvicorn) with the
Redis channel layer, `manage.py ingest` for the job, PostgreSQL (or SQLite without
DATABASE_URL). `--clients` websocket clients (autobahn's asyncio flavour) connect to
`/ws/jobs/<id>/` with an API token and take their snapshot (in a process of their own: the
publisher's and the server's work does not delay their reading, nor theirs the publishing);
then the engine's `EventLog` publishes `--rate` engine-shaped events per second (step,
experts, ops, checkpoints, anomalies, actions: bench.platform_env.engine_events) for
`--seconds`. Every client must receive every
sequence number, in order; the delay of an event at a client is its arrival time minus the
`time` the engine stamped on it at publish (same host, same clock). Target (issue 9): every
event at all 50 clients, p99 delay <= 500 ms. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from urllib.parse import urlsplit

from bench.platform_env import Platform, distribution, engine_events

TARGET_P99_MS = 500.0
DRAIN_TIMEOUT_S = 20.0


async def watch(url: str, clients: int, expect: int, seconds: float) -> dict:
    """Connect `clients` websockets to `url`; once all hold their snapshot say "ready" on
    stdout, then wait for `expect` events at each (published over `seconds`). Every client's
    sequence numbers must be the `expect` numbers after its snapshot's, in order."""
    # autobahn's asyncio flavour: it cannot be imported where Django (with daphne's twisted
    # reactor) is
    from autobahn.asyncio.websocket import WebSocketClientFactory, WebSocketClientProtocol

    class Watcher(WebSocketClientProtocol):
        def __init__(self) -> None:
            super().__init__()
            self.seqs: list[int] = []
            self.delays_ms: list[float] = []
            self.snapshot = asyncio.get_running_loop().create_future()

        def onMessage(self, payload: bytes, is_binary: bool) -> None:  # noqa: N802 (autobahn's)
            arrived = time.time()
            message = json.loads(payload)
            if message["type"] == "snapshot":
                self.snapshot.set_result(message["seq"])
            elif "time" in message:
                self.seqs.append(message["seq"])
                self.delays_ms.append((arrived - message["time"]) * 1000)

    parts = urlsplit(url)
    factory = WebSocketClientFactory(url)
    factory.protocol = Watcher
    loop = asyncio.get_running_loop()
    watchers = []
    for _ in range(clients):
        _, protocol = await loop.create_connection(factory, parts.hostname, parts.port)
        watchers.append(protocol)
    snapshots = await asyncio.wait_for(asyncio.gather(*(w.snapshot for w in watchers)), 60)
    print("ready", flush=True)
    # the publisher starts now and takes `seconds`; what is missing after that and the drain
    # timeout never came
    deadline = time.monotonic() + seconds + DRAIN_TIMEOUT_S
    while any(len(w.seqs) < expect for w in watchers) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    for w in watchers:
        w.sendClose()
    return {
        "complete": sum(w.seqs == list(range(s + 1, s + expect + 1))
                        for w, s in zip(watchers, snapshots, strict=True)),
        "fewest": min(len(w.seqs) for w in watchers),
        "delays_ms": [d for w in watchers for d in w.delays_ms],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=float, default=20.0, help="events published per second")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--watch", metavar="URL", help=argparse.SUPPRESS)  # the clients' process
    args = parser.parse_args()
    expect = int(args.rate * args.seconds)
    if args.watch:
        print(json.dumps(asyncio.run(watch(args.watch, args.clients, expect, args.seconds))))
        return

    with Platform() as platform:
        from engine.runtime.events import EventLog

        base = platform.web()
        job = platform.job
        platform.ingest(job.pk)
        url = f"ws://{urlsplit(base).netloc}/ws/jobs/{job.pk}/?token={platform.token}"
        clients = subprocess.Popen(
            [sys.executable, "-m", "bench.ws_fanout", "--watch", url, "--clients",
             str(args.clients), "--rate", str(args.rate), "--seconds", str(args.seconds)],
            stdout=subprocess.PIPE, text=True)
        if clients.stdout.readline().strip() != "ready":
            raise RuntimeError("the websocket clients did not get their snapshots")
        log = EventLog(str(job.pk), bus_url=platform.redis_url)
        events = engine_events()
        started = time.monotonic()
        for i in range(expect):
            # a steady pace: each event in its own slot, however long the last one took
            time.sleep(max(0.0, started + i / args.rate - time.monotonic()))
            type, step, fields = next(events)
            log.emit_wire(type, step, **fields)
        log.close()
        result = json.loads(clients.communicate(timeout=DRAIN_TIMEOUT_S + 30)[0])
        delays = distribution(result["delays_ms"])
        print(json.dumps({
            "benchmark": "ws_fanout",
            "database": platform.database,
            "clients": args.clients,
            "events_per_s": args.rate,
            "events_published": expect,
            "clients_with_every_event_in_order": result["complete"],
            "fewest_events_at_a_client": result["fewest"],
            "delay_ms": delays,
            "target_p99_ms": TARGET_P99_MS,
            "met": result["complete"] == args.clients and delays["p99"] <= TARGET_P99_MS,
        }, indent=2))


if __name__ == "__main__":
    main()
