"""Ring vs hierarchical vs HO-Ring vs torch.distributed on an emulated multi-node cluster.

    sudo .venv/bin/python -m bench.collectives [--nodes 2 --procs-per-node 2 --inter-gbit 1]

Brings up the emulated cluster (bench.cluster; one shaped NIC per local rank), runs one
gloo rank per (node, local rank) in its namespace, calibrates the cost model's links with
short probes, then times every algorithm for all-reduce, reduce-scatter and all-gather of
fp32 buffers at each size (median of --repeats rounds after a warm-up round, the algorithms
taking turns within each round; a collective's time is its slowest rank's). Prints one JSON
document: the settings, the calibrated links, one row per (collective, size, algorithm) with
algorithm and bus bandwidth, the ratios to `ring` and to `native`, the cost model's
prediction and error, and the alpha-beta lower bound of the emulated links (nominal NIC
rate), and a top-level `ratios` object:

    horing_vs_ring_32mb    ring time / horing time, 32 MB all-reduce
    horing_vs_hier_32mb    hier time / horing time, 32 MB all-reduce
    horing_vs_bound_32mb   lower bound / horing time, 32 MB all-reduce (a fraction)
    cost_model_max_error   the largest |predicted - measured| / measured over the rows of
                           ring, hier and horing at --error-sizes-mb (default 8, 32 and
                           128 MB; a fraction); over every row, 1 MB and native included,
                           it is `cost_model_max_error_all`
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from bench.cluster import ClusterSpec, cluster, run
from engine.horing import ALGOS, Topology, all_gather, all_reduce, reduce_scatter, shard_size
from engine.horing.cost import COLLECTIVES, Links, Tier, lower_bound, predict

MB = 1 << 20
# our algorithms, which the cost model describes step by step; `native` is gloo's own (its
# reduce-scatter, for one, also copies the input), so its error is reported apart
MODELLED = ("ring", "hier", "horing")


def _collective(op: str, algo: str, numel: int, topo: Topology):
    """A function that runs `op` once on buffers allocated here."""
    if op == "all_reduce":
        buf = torch.zeros(numel)
        return lambda: all_reduce(buf, topo, algo=algo)
    shard = torch.zeros(shard_size(numel, topo.world_size))
    full = torch.zeros(numel)
    if op == "reduce_scatter":
        return lambda: reduce_scatter(shard, full, topo, algo=algo)
    return lambda: all_gather(full, shard, topo, algo=algo)


def _seconds(fn) -> float:
    """One run of `fn`, timed as the slowest rank saw it."""
    dist.barrier()
    start = time.perf_counter()
    fn()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def _time_side_by_side(op: str, numel: int, topo: Topology, repeats: int) -> dict[str, float]:
    """Median seconds per algorithm; the algorithms take turns within every round, so a burst
    of other work on the host slows all of them alike instead of one algorithm's block."""
    runs = {algo: _collective(op, algo, numel, topo) for algo in ALGOS}
    samples: dict[str, list[float]] = {algo: [] for algo in ALGOS}
    for round_ in range(repeats + 1):  # round 0 warms up connections and buffers
        for algo, fn in runs.items():
            seconds = _seconds(fn)
            if round_:
                samples[algo].append(seconds)
    return {algo: statistics.median(times) for algo, times in samples.items()}


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    topo = Topology.from_env().init_groups()
    from engine.horing.cost import calibrate

    # calibrate on a warm host, as every timing below is taken: one 32 MB all-reduce of each
    # algorithm first (a cold first calibration probed intra 434-594 MB/s, later ones on the
    # same cluster 580-870 MB/s; after this warm-up the first one probes 689-703 MB/s)
    warm = torch.zeros(32 * MB // 4)
    for algo in ALGOS:
        all_reduce(warm, topo, algo=algo)
    links = calibrate(topo)
    rows = []
    for size_mb in args.sizes_mb:
        numel = int(size_mb * MB) // 4
        for op in COLLECTIVES:
            for algo, seconds in _time_side_by_side(op, numel, topo, args.repeats).items():
                rows.append({"op": op, "size_mb": size_mb, "algo": algo, "seconds": seconds})
    if dist.get_rank() == 0:
        Path(args.result).write_text(json.dumps({"links": _links_json(links), "rows": rows}))
    dist.destroy_process_group()


def _links_json(links: Links) -> dict:
    # a tier the topology lacks has infinite bandwidth, which JSON cannot hold: null
    return {
        name: {
            "latency_s": tier.latency_s,
            "bandwidth_Bps": tier.bandwidth if math.isfinite(tier.bandwidth) else None,
        }
        for name, tier in (("intra", links.intra), ("inter", links.inter))
    }


def report(measured: dict, spec: ClusterSpec, args: argparse.Namespace) -> dict:
    topo = Topology(spec.nodes, spec.procs_per_node)
    links = Links(
        **{
            name: Tier(tier["latency_s"], tier["bandwidth_Bps"] or math.inf)
            for name, tier in measured["links"].items()
        }
    )
    nominal = Tier(spec.latency_ms / 1000, spec.inter_gbit * 1e9 / 8)
    n = topo.world_size
    by_key = {(r["op"], r["size_mb"], r["algo"]): r["seconds"] for r in measured["rows"]}
    rows = []
    for (op, size_mb, algo), seconds in by_key.items():
        nbytes = int(size_mb * MB)
        bus_factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
        predicted = predict(algo, op, nbytes, topo, links)
        bound = lower_bound(op, nbytes, topo, nominal)
        rows.append(
            {
                "op": op,
                "size_mb": size_mb,
                "algo": algo,
                "seconds": seconds,
                "algbw_GBps": nbytes / seconds / 1e9,
                "busbw_GBps": nbytes / seconds / 1e9 * bus_factor,
                "vs_ring": by_key[(op, size_mb, "ring")] / seconds,
                "vs_native": by_key[(op, size_mb, "native")] / seconds,
                "predicted_s": predicted,
                "model_error": abs(predicted - seconds) / seconds,
                "lower_bound_s": bound,
                "vs_bound": bound / seconds,
            }
        )
    ar32 = {r["algo"]: r for r in rows if r["op"] == "all_reduce" and r["size_mb"] == 32}
    errors = [
        r["model_error"]
        for r in rows
        if r["size_mb"] in args.error_sizes_mb and r["algo"] in MODELLED
    ]
    if not errors:
        raise ValueError("--error-sizes-mb: none of these sizes was measured")
    return {
        "benchmark": "horing collectives on an emulated cluster",
        "cluster": asdict(spec),
        "dtype": "float32",
        "repeats": args.repeats,
        "links": measured["links"],
        "rows": rows,
        "ratios": {
            "horing_vs_ring_32mb": ar32["ring"]["seconds"] / ar32["horing"]["seconds"],
            "horing_vs_hier_32mb": ar32["hier"]["seconds"] / ar32["horing"]["seconds"],
            "horing_vs_bound_32mb": ar32["horing"]["vs_bound"],
            "cost_model_max_error": max(errors),
        },
        "cost_model_error_sizes_mb": args.error_sizes_mb,
        "cost_model_max_error_all": max(r["model_error"] for r in rows),
        "cost_model_max_error_native": max(r["model_error"] for r in rows if r["algo"] == "native"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.collectives", description=__doc__)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--procs-per-node", type=int, default=2)
    parser.add_argument("--inter-gbit", type=float, default=1.0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 8, 32, 128])
    # 1 MB collectives take a few ms, where the host's scheduling noise is as large as the
    # whole prediction; their errors are reported per row and in cost_model_max_error_all
    parser.add_argument("--error-sizes-mb", type=float, nargs="+", default=[8, 32, 128])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if 32 not in args.sizes_mb:
        parser.error("--sizes-mb must include 32 (the ratios are taken there)")
    if args.worker:
        worker(args)
        return 0
    if os.geteuid() != 0:
        parser.error("the emulated cluster needs root (network namespaces and tc)")
    spec = ClusterSpec(args.nodes, args.procs_per_node, args.inter_gbit, args.latency_ms)
    with tempfile.TemporaryDirectory() as tmp, cluster(spec):
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "bench.collectives", "--worker", "--result", str(result)]
        cmd += ["--sizes-mb", *map(str, args.sizes_mb), "--repeats", str(args.repeats)]
        status = run(cmd, timeout=args.timeout)
        if status:
            print(f"bench.collectives: a rank failed with status {status}", file=sys.stderr)
            return status
        measured = json.loads(result.read_text())
    print(json.dumps(report(measured, spec, args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
