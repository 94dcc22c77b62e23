"""The PaRO planner: predicted memory and step time of every strategy, best first.

Memory per device is spec section 4: M = b*Psi*f_p + b*Psi'*f_g + o*Psi'*f_os, with b = 2 and
o = 12 (fp32 master, Adam m and v) for bf16, b = 4 and o = 8 for the fp32 CPU engine, whose
parameters are their own master weights. A strategy fits when M is within the budget; the
transient buffers of this engine (the gathered b*Psi parameters when p is sharded, the b*Psi'
local gradient of one backward) are reported as `peak_bytes`.

Step time is the cost model of spec section 7 evaluated on the collectives this engine runs,
which are exactly the schedule of section 5 (`schedule()`); the engine runs them after each
backward, not overlapped with it, so the terms add up:

    T = A * T_fb + sum over the schedule's collectives + t_opt

with T_fb the measured or given forward+backward time of one micro-batch, every one-tier
collective priced as a ring on that tier's `engine.horing.cost.Tier`, every global one by
`engine.horing.cost.predict` ("native" composes intra and rail stages one after another,
which is the "hier" model), and t_opt = read+write of the owned optimizer shard.

    python -m engine.paro.plan --preset small --nodes 2 --procs-per-node 2 --budget-gb 1

(engine/paro/plan.py is only that command, so `engine.paro.plan` stays the function.)
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from engine.contract import COLLECTIVES, STRATEGIES
from engine.horing.cost import Links as Links  # re-exported: what the platform plans over
from engine.horing.cost import Tier as Tier
from engine.horing.cost import predict
from engine.horing.topology import Topology as Topology
from engine.moe.config import PRESETS, MoEConfig, flops_per_token, param_count, preset
from engine.paro.strategy import Level, Strategy, parse_strategy

# The links collectives are priced on when none were measured (the command line's defaults):
# 800 Gbit/s and 5 us per rank within a node, 100 Gbit/s and 20 us per NIC between nodes.
DEFAULT_LINKS = Links(intra=Tier(5e-6, 800e9 / 8), inter=Tier(20e-6, 100e9 / 8))


@dataclass(frozen=True)
class Collective:
    op: str  # all_reduce | reduce_scatter | all_gather
    scope: str  # intra | inter | global
    nbytes: float  # the unsharded size
    count: int  # how many per optimizer step


@dataclass(frozen=True)
class PlanRow:
    strategy: str
    fits: bool
    memory_bytes: float  # persistent params + grads + optimizer states per device
    params_bytes: float
    grads_bytes: float
    optim_bytes: float
    peak_bytes: float  # memory_bytes + this engine's transient buffers
    step_time_s: float
    compute_time_s: float
    comm_time_s: float
    optim_time_s: float
    intra_bytes: float  # sent per device per optimizer step
    inter_bytes: float
    intra_calls: int
    inter_calls: int
    # every strategy this row stands for: on one node I (the node) and G (all ranks) are the
    # same group, so NII, NIG and NGG run the same collectives on the same shards
    names: tuple[str, ...] = ()


def schedule(
    strategy: Strategy, psi: float, trainable: float, grad_accum: int, dtype_bytes: int
) -> list[Collective]:
    """The collectives of one optimizer step, spec section 5."""
    s, a = strategy, grad_accum
    nii_fp32 = 4 * trainable  # NII's rail all-reduce runs in fp32 (spec section 5)
    params, grads = dtype_bytes * psi, dtype_bytes * trainable
    out = []
    if s.params != "N":  # gathered before forward and again before backward
        out.append(Collective("all_gather", _scope(s.params), params, 2 * a))
    if s.grads != "N":
        out.append(Collective("reduce_scatter", _scope(s.grads), grads, a))
    boundary = {
        ("N", "N"): [Collective("all_reduce", "global", grads, 1)],
        ("N", "G"): [Collective("reduce_scatter", "global", grads, 1)],
        ("I", "I"): [Collective("all_reduce", "inter", nii_fp32 if s.params == "N" else grads, 1)],
        ("I", "G"): [Collective("reduce_scatter", "inter", grads, 1)],
        ("G", "G"): [],
    }[s.grads, s.optim]
    sync = {
        ("N", "G"): [Collective("all_gather", "global", grads, 1)],
        ("N", "I"): [Collective("all_gather", "intra", grads, 1)],
        ("I", "G"): [Collective("all_gather", "inter", grads, 1)],
    }.get((s.params, s.optim), [])
    return out + boundary + sync


def plan(
    model_config: MoEConfig | int,
    topology: Topology,
    memory_budget_bytes: float,
    grad_accum: int,
    links: Links,
    *,
    trainable: int | None = None,
    compute_time_s: float = 0.0,
    dtype_bytes: int = 2,
    collective: str = "native",
    optimizer_bytes_per_s: float = 1e12,
) -> list[PlanRow]:
    """Every strategy with its predicted memory and step time; those that fit first, fastest
    first, then the rest by memory. `model_config` is an MoEConfig or a parameter count;
    `trainable` (Psi') defaults to all parameters; `compute_time_s` is one micro-batch's
    forward+backward; `links` the two tiers (engine.horing.cost.calibrate measures them)."""
    psi = _param_count(model_config)
    trainable = psi if trainable is None else trainable
    _check_arguments(psi=psi, trainable=trainable, memory_budget_bytes=memory_budget_bytes,
                     grad_accum=grad_accum, compute_time_s=compute_time_s,
                     dtype_bytes=dtype_bytes, optimizer_bytes_per_s=optimizer_bytes_per_s)
    g, n = topology.procs_per_node, topology.world_size
    # fp32 master weights + Adam's m and v; fp32 parameters are their own master weights
    optim_bytes = 12 if dtype_bytes == 2 else 8
    rows = []
    for name in STRATEGIES:
        s = parse_strategy(name)
        share = {"N": 1.0, "I": 1.0 / g, "G": 1.0 / n}
        p_bytes = dtype_bytes * psi * share[s.params]
        g_bytes = dtype_bytes * trainable * share[s.grads]
        o_bytes = optim_bytes * trainable * share[s.optim]
        memory = p_bytes + g_bytes + o_bytes
        transient = dtype_bytes * trainable + (dtype_bytes * psi if s.params != "N" else 0)
        colls = schedule(s, psi, trainable, grad_accum, dtype_bytes)
        comm = sum(c.count * _time(c, topology, links, collective) for c in colls)
        optim_time = 2 * o_bytes / optimizer_bytes_per_s
        compute = grad_accum * compute_time_s
        rows.append(PlanRow(
            strategy=name, fits=memory <= memory_budget_bytes, memory_bytes=memory,
            params_bytes=p_bytes, grads_bytes=g_bytes, optim_bytes=o_bytes,
            peak_bytes=memory + transient, step_time_s=compute + comm + optim_time,
            compute_time_s=compute, comm_time_s=comm, optim_time_s=optim_time,
            **_volumes(colls, topology),
        ))
    return sorted(rows, key=lambda r: (not r.fits, r.step_time_s if r.fits else r.memory_bytes))


def _check_arguments(psi: int, trainable: int, memory_budget_bytes: float, grad_accum: int,
                     compute_time_s: float, dtype_bytes: int,
                     optimizer_bytes_per_s: float) -> None:
    checks = {  # name: (value, valid)
        "model_config": (psi, psi >= 1),
        "trainable": (trainable, 0 <= trainable <= psi),
        "memory_budget_bytes": (memory_budget_bytes, memory_budget_bytes >= 0),
        "grad_accum": (grad_accum, grad_accum >= 1),
        "compute_time_s": (compute_time_s, compute_time_s >= 0),
        "dtype_bytes": (dtype_bytes, dtype_bytes in (2, 4)),
        "optimizer_bytes_per_s": (optimizer_bytes_per_s, optimizer_bytes_per_s > 0),
    }
    for name, (value, valid) in checks.items():
        if not valid:
            raise ValueError(f"{name}: invalid value for the planner ({value!r})")


def merge_equivalent(rows: list[PlanRow], topology: Topology) -> list[PlanRow]:
    """One row per distinct strategy: on one node a name with I for G (NII, NIG -> NGG) runs
    what the G name runs, so those rows become the G name's row, naming all of them. A name
    whose G form is not a strategy (ING -> GNG) stays its own."""
    if topology.nodes > 1:
        return [dataclasses.replace(r, names=(r.strategy,)) for r in rows]
    by_name = {r.strategy: r for r in rows}
    groups: dict[str, list[str]] = {}
    for name in STRATEGIES:
        canonical = name.replace("I", "G")
        groups.setdefault(canonical if canonical in by_name else name, []).append(name)
    merged = [dataclasses.replace(by_name[head], names=tuple(names))
              for head, names in groups.items()]
    order = {r.strategy: i for i, r in enumerate(rows)}
    return sorted(merged, key=lambda r: order[r.strategy])


def ranks_per_device(world_size: int, device: str, devices: int = 1) -> int:
    """How many ranks share one device: the engine runs every rank on one host, so on CPU
    they all share its cores; on GPU, ceil(world_size / devices) share each GPU."""
    return world_size if device == "cpu" else -(-world_size // max(1, devices))


def compute_time_s(config: MoEConfig, seq_len: int, micro_batch: int, flops_per_s: float,
                   sharing: int = 1) -> float:
    """One rank's forward+backward of one micro-batch on a device of `flops_per_s` that
    `sharing` ranks take turns on (what `plan` takes as compute_time_s)."""
    return flops_per_token(config, seq_len) * micro_batch * seq_len * sharing / flops_per_s


def effective_flops_per_s(config: MoEConfig, seq_len: int, tokens_per_rank: int,
                          compute_s: float, sharing: int = 1) -> float:
    """A device's training FLOP/s as one measured step shows it: `compute_s` is a rank's
    step less its collectives and data wait (the `compute_ms` of an ops event's rank rows)
    for `tokens_per_rank` tokens (micro_batch * seq_len * grad_accum)."""
    return flops_per_token(config, seq_len) * tokens_per_rank * sharing / compute_s


def _param_count(model_config: MoEConfig | int) -> int:
    return param_count(model_config) if isinstance(model_config, MoEConfig) else model_config


def _scope(level: Level) -> str:
    return "intra" if level == "I" else "global"


def _ring(op: str, nbytes: float, members: int, tier: Tier) -> float:
    if members == 1:
        return 0.0
    steps = (2 if op == "all_reduce" else 1) * (members - 1)
    return steps * tier.step(nbytes / members)


def _time(c: Collective, topo: Topology, links: Links, collective: str) -> float:
    if c.scope == "intra":
        return _ring(c.op, c.nbytes, topo.procs_per_node, links.intra)
    if c.scope == "inter":  # the rail carries 1/g of the buffer: an I <-> G conversion
        return _ring(c.op, c.nbytes / topo.procs_per_node, topo.nodes, links.inter)
    algo = "hier" if collective == "native" else collective
    return predict(algo, c.op, int(c.nbytes), topo, links)


def _volumes(colls: list[Collective], topo: Topology) -> dict[str, float]:
    """Bytes and calls per tier, counted as engine.paro.comm counts them."""
    g, r = topo.procs_per_node, topo.nodes
    out = {"intra_bytes": 0.0, "inter_bytes": 0.0, "intra_calls": 0, "inter_calls": 0}

    def add(tier: str, members: int, nbytes: float, factor: int, count: int) -> None:
        if members > 1:
            out[f"{tier}_bytes"] += count * factor * (members - 1) / members * nbytes
            out[f"{tier}_calls"] += count

    for c in colls:
        factor = 2 if c.op == "all_reduce" else 1
        if c.scope == "intra":
            add("intra", g, c.nbytes, factor, c.count)
        elif c.scope == "inter":
            add("inter", r, c.nbytes / g, factor, c.count)
        else:  # the intra part of an all-reduce is a reduce-scatter and an all-gather
            add("intra", g, c.nbytes, 1, c.count * factor)
            add("inter", r, c.nbytes / g, factor, c.count)
    return out


def format_table(rows: list[PlanRow], budget: float) -> str:
    gb = 1e9
    head = (
        f"{'rank':>4} {'strategy':>8} {'fits':>4} {'memory GB':>10} {'margin GB':>10} "
        f"{'peak GB':>9} {'step s':>10} {'comm s':>10} {'inter GB':>9} {'intra GB':>9}"
    )
    lines = [head, "-" * len(head)]
    for i, r in enumerate(rows, 1):
        lines.append(
            f"{i:>4} {r.strategy:>8} {'yes' if r.fits else 'no':>4} {r.memory_bytes / gb:>10.3f} "
            f"{(budget - r.memory_bytes) / gb:>10.3f} {r.peak_bytes / gb:>9.3f} "
            f"{r.step_time_s:>10.4f} {r.comm_time_s:>10.4f} {r.inter_bytes / gb:>9.3f} "
            f"{r.intra_bytes / gb:>9.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m engine.paro.plan", description=__doc__.split("\n")[0]
    )
    model = ap.add_mutually_exclusive_group(required=True)
    model.add_argument("--preset", choices=sorted(PRESETS), help="an engine.moe preset")
    model.add_argument("--params", type=float, help="parameter count, e.g. 6.74e9")
    ap.add_argument("--trainable", type=float, help="trainable parameters (default: all)")
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--procs-per-node", type=int, required=True)
    ap.add_argument("--budget-gb", type=float, required=True, help="model-state GB per device")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--intra-gbps", type=float, default=800.0, help="Gbit/s per rank in a node")
    ap.add_argument("--inter-gbps", type=float, default=100.0, help="Gbit/s per NIC")
    ap.add_argument("--intra-latency-us", type=float, default=5.0)
    ap.add_argument("--inter-latency-us", type=float, default=20.0)
    ap.add_argument("--compute-s", type=float, default=0.0, help="fwd+bwd per micro-batch")
    ap.add_argument("--dtype-bytes", type=int, default=2, choices=(2, 4))
    ap.add_argument("--collective", default="native", choices=COLLECTIVES)
    args = ap.parse_args(argv)
    model_config = preset(args.preset) if args.preset else int(args.params)
    links = Links(
        intra=Tier(args.intra_latency_us * 1e-6, args.intra_gbps * 1e9 / 8),
        inter=Tier(args.inter_latency_us * 1e-6, args.inter_gbps * 1e9 / 8),
    )
    try:
        rows = plan(
            model_config,
            Topology(args.nodes, args.procs_per_node),
            args.budget_gb * 1e9,
            args.grad_accum,
            links,
            trainable=None if args.trainable is None else int(args.trainable),
            compute_time_s=args.compute_s,
            dtype_bytes=args.dtype_bytes,
            collective=args.collective,
        )
    except ValueError as e:
        ap.error(str(e))
    print(format_table(rows, args.budget_gb * 1e9))
