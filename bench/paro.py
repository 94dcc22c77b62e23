"""PaRO strategies vs torch DDP, FSDP2 fully_shard and FSDP2 HSDP on an emulated 2-tier cluster.

    .venv/bin/python -m bench.paro [--nodes 2 --procs-per-node 2 --inter-gbit 1]
    .venv/bin/python -m bench.paro --localhost      # plain gloo on loopback, no shaping

Brings up the emulated cluster (bench.cluster: one namespace per node, one 1 Gbit/s NIC per
local rank; needs root), runs one gloo rank per (node, local rank), and trains the same MoE
model (about 23M parameters, fp32) on the same global batches with grad_accum 4 under each
of the ten PaRO strategies and six baselines: torch DDP, FSDP2 `fully_shard` on a 1-D mesh
and FSDP2 HSDP on a (replicate=nodes, shard=procs_per_node) mesh, each "default" (as
documented: every micro-step synchronises) and "tuned" (DDP `no_sync()`, fully_shard
`set_requires_gradient_sync(False)`, HSDP `set_requires_all_reduce(False)` on the non-final
micro-steps).

The configurations take turns: in each of --rounds rounds every configuration is built
afresh and trains one warm-up step and --steps timed steps (the order reversed on alternate
rounds), so a burst of other work on the shared host, or a drift in its load, falls on all of
them alike instead of on one configuration's block. Per configuration it reports the median
step time (slowest rank) over all its timed steps, tokens/s, the model-state bytes
(parameters + gradients + optimizer states) held per rank between micro-steps (max over
ranks and micro-steps; FSDP2's unsharded gradient accumulators included), the inter-node
bytes per step (measured: tx bytes of the node's NICs per rank, from /sys/class/net; null on
--localhost) and, for PaRO, the bytes its counters attribute to the inter tier.

Budgets are 50% and 35% of DDP's model-state bytes; a configuration fits when its
model-state bytes are within the budget. The planner (engine.paro.plan, with links
calibrated by engine.horing.cost.calibrate and the measured forward+backward time) picks a
strategy per budget. One JSON document; `ratios`:

    best_vs_default_b50      best fitting PaRO tokens/s / best fitting default baseline
    best_vs_tuned_b50        best fitting PaRO / best fitting tuned baseline
    best_vs_baselines_b35    best fitting PaRO / best fitting baseline, default or tuned
    planner_pick_vs_best_b50 the planner's pick / the best fitting PaRO strategy (measured)
    planner_pick_vs_best_b35
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel

from engine.contract import STRATEGIES
from engine.horing.cost import Links, Tier, calibrate
from engine.horing.topology import Topology
from engine.moe import MoEConfig, MoEModel, preset
from engine.paro import ShardedDataParallel
from engine.paro.planner import plan

GRAD_ACCUM, MICRO_BATCH, SEQ_LEN = 4, 1, 64
LR, CLIP = 3e-4, 1.0
BASELINES = ("ddp", "fsdp", "hsdp")
BUDGETS = {"b50": 0.50, "b35": 0.35}
PORT = 29533  # away from bench.cluster's default, so another benchmark's ranks never meet ours
PARO_CLUSTER = "rsparo"  # the namespaces' name prefix, see main()


def model_config() -> MoEConfig:
    """~23M parameters, most in routed experts, so communication outweighs compute; every
    dimension divisible by 4 so FSDP2's per-parameter shards need no padding."""
    return dataclasses.replace(
        preset("nano"), vocab_size=4096, hidden_size=256, intermediate_size=1024,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        num_experts=32, n_group=4, topk_group=2, num_experts_per_tok=4,
        moe_intermediate_size=256, num_nextn_predict_layers=0,
    )  # fmt: skip


def batches(step: int, world: int, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's micro-batches of optimizer step `step` (the same global batch everywhere)."""
    gen = torch.Generator().manual_seed(step)
    vocab = model_config().vocab_size
    tokens = torch.randint(0, vocab, (GRAD_ACCUM, world * MICRO_BATCH, SEQ_LEN + 1), generator=gen)
    mine = tokens[:, rank * MICRO_BATCH : (rank + 1) * MICRO_BATCH]
    return [(m[:, :-1], m[:, 1:]) for m in mine]


# ---------------------------------------------------------------------- configurations


@dataclasses.dataclass
class Trainer:
    """One configuration: `micro(ids, labels, last)` per micro-batch, then `step()`."""

    micro: Callable[[torch.Tensor, torch.Tensor, bool], object]
    step: Callable[[], object]
    state_bytes: Callable[[], int]  # model-state bytes this rank holds right now
    inter_counted: Callable[[], int] | None = None  # PaRO's own count of the last step


def paro_trainer(name: str, topo: Topology, collective: str) -> Trainer:
    torch.manual_seed(0)
    dp = ShardedDataParallel(
        MoEModel(model_config()), topo, name, lr=LR, grad_accum=GRAD_ACCUM, collective=collective
    )
    return Trainer(
        micro=lambda ids, labels, last: dp.forward_backward(ids, labels),
        step=lambda: dp.step(LR, CLIP),
        state_bytes=lambda: sum(dp.state_bytes().values()),
        inter_counted=lambda: dp.comm_stats()["inter_bytes"],
    )


def baseline_meshes(topo: Topology) -> dict[str, DeviceMesh]:
    """FSDP2's meshes, built once: each build creates process groups (and their connections),
    which a configuration built afresh every round should not pay inside its warm-up."""
    return {
        "fsdp": init_device_mesh("cpu", (topo.world_size,)),
        "hsdp": init_device_mesh(
            "cpu", (topo.nodes, topo.procs_per_node), mesh_dim_names=("replicate", "shard")
        ),
    }


def baseline_trainer(kind: str, tuned: bool, meshes: dict[str, DeviceMesh]) -> Trainer:
    torch.manual_seed(0)
    model = MoEModel(model_config())
    if kind == "ddp":
        wrapped = DistributedDataParallel(model)
    else:
        mesh = meshes[kind]
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        wrapped = model
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)

    def micro(ids: torch.Tensor, labels: torch.Tensor, last: bool) -> None:
        if kind == "ddp" and tuned and not last:
            with wrapped.no_sync():
                (wrapped(ids, labels).loss / GRAD_ACCUM).backward()
            return
        if kind == "fsdp" and tuned:
            model.set_requires_gradient_sync(last)
        if kind == "hsdp" and tuned:
            model.set_requires_all_reduce(last)
        (wrapped(ids, labels).loss / GRAD_ACCUM).backward()

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def state_bytes() -> int:
        tensors = [_local(p) for p in model.parameters()]
        tensors += [_local(p.grad) for p in model.parameters() if p.grad is not None]
        tensors += [_local(v) for s in opt.state.values() for v in s.values() if v.ndim > 0]
        tensors += _fsdp_unsharded_grads(model)
        return sum(t.numel() * t.element_size() for t in tensors)

    return Trainer(micro, step, state_bytes)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _fsdp_unsharded_grads(model: torch.nn.Module) -> list[torch.Tensor]:
    """Gradients FSDP2 accumulates unsharded while gradient sync is off (private state)."""
    out = []
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        for fp in group.fsdp_params if group else []:
            unsharded = getattr(fp, "_unsharded_param", None)
            for grad in (getattr(unsharded, "grad", None), fp.unsharded_accumulated_grad):
                if grad is not None and grad.untyped_storage().size() > 0:
                    out.append(grad)
    return out


# -------------------------------------------------------------------------- the ranks


def nic_tx_bytes(topo: Topology) -> int | None:
    """Bytes sent by this node's NICs (the emulated cluster's nic<j>); None off-cluster."""
    total = 0
    for local in range(topo.procs_per_node):
        path = Path(f"/sys/class/net/nic{local}/statistics/tx_bytes")
        if not path.exists():
            return None
        total += int(path.read_text())
    return total


@dataclasses.dataclass
class Samples:
    """One configuration's measurements, accumulated over the rounds (this rank's view)."""

    times: list[float] = dataclasses.field(default_factory=list)  # slowest rank's, per step
    state: int = 0
    tx: list[float] = dataclasses.field(default_factory=list)
    inter_counted: int | None = None


def measure(trainer: Trainer, topo: Topology, steps: int, into: Samples) -> None:
    """One warm-up step, then `steps` timed ones, added to `into`."""
    world, rank = topo.world_size, dist.get_rank()
    for step in range(steps + 1):  # step 0 warms up
        dist.barrier()
        sent = nic_tx_bytes(topo)
        start = time.perf_counter()
        for i, (ids, labels) in enumerate(batches(step, world, rank)):
            trainer.micro(ids, labels, i == GRAD_ACCUM - 1)
            into.state = max(into.state, trainer.state_bytes())
        trainer.step()
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
        if step:
            into.times.append(elapsed.item())
            if sent is not None:
                into.tx.append((nic_tx_bytes(topo) - sent) / topo.procs_per_node)
    if trainer.inter_counted is not None:
        into.inter_counted = trainer.inter_counted()


def summarise(samples: Samples, world: int) -> dict:
    worst = torch.tensor([float(samples.state), max(samples.tx, default=-1.0)])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    step_time = statistics.median(samples.times)
    row = {
        "step_time_s": step_time,
        "step_time_min_s": min(samples.times),
        "timed_steps": len(samples.times),
        "tokens_per_s": GRAD_ACCUM * world * MICRO_BATCH * SEQ_LEN / step_time,
        "model_state_bytes": int(worst[0].item()),
        "inter_bytes_per_step_measured": None if worst[1] < 0 else int(worst[1].item()),
    }
    if samples.inter_counted is not None:
        row["inter_bytes_per_step_counted"] = samples.inter_counted
    return row


def compute_time() -> float:
    """Forward+backward of one micro-batch, no communication (median of 3 after a warm-up)."""
    torch.manual_seed(0)
    model = MoEModel(model_config())
    ids, labels = batches(0, 1, 0)[0]
    samples = []
    for _ in range(4):
        start = time.perf_counter()
        model(ids, labels).loss.backward()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples[1:])


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    topo = Topology.from_env().init_groups()
    links = calibrate(topo)
    fb = torch.tensor([compute_time()])
    dist.all_reduce(fb, op=dist.ReduceOp.MAX)
    meshes = baseline_meshes(topo)
    builders: dict[str, Callable[[], Trainer]] = {
        name: lambda name=name: paro_trainer(name, topo, args.collective)
        for name in args.strategies
    }
    for kind in BASELINES:
        for tuned in (False, True):
            label = f"{kind}_{'tuned' if tuned else 'default'}"
            builders[label] = lambda kind=kind, tuned=tuned: baseline_trainer(kind, tuned, meshes)
    samples = {label: Samples() for label in builders}
    for round_ in range(args.rounds):
        order = list(builders) if round_ % 2 == 0 else list(reversed(builders))
        for label in order:
            measure(builders[label](), topo, args.steps, samples[label])
            gc.collect()  # the configuration's buffers go before the next one is built
    rows = {label: summarise(samples[label], topo.world_size) for label in builders}
    if dist.get_rank() == 0:
        Path(args.result).write_text(
            json.dumps({"links": _links_json(links), "compute_time_s": fb.item(), "rows": rows})
        )
    dist.destroy_process_group()


def _links_json(links: Links) -> dict:
    return {
        name: {"latency_s": tier.latency_s, "bandwidth_Bps": tier.bandwidth}
        for name, tier in (("intra", links.intra), ("inter", links.inter))
    }


# ----------------------------------------------------------------------------- report


def report(measured: dict, topo: Topology, args: argparse.Namespace, where: dict) -> dict:
    rows = measured["rows"]
    links = Links(
        **{k: Tier(v["latency_s"], v["bandwidth_Bps"]) for k, v in measured["links"].items()}
    )
    ddp_bytes = rows["ddp_default"]["model_state_bytes"]
    paro = [n for n in rows if n in STRATEGIES]
    default = [f"{k}_default" for k in BASELINES]
    tuned = [f"{k}_tuned" for k in BASELINES]

    def best(names: list[str], budget: float) -> str | None:
        fit = [n for n in names if rows[n]["model_state_bytes"] <= budget]
        return max(fit, key=lambda n: rows[n]["tokens_per_s"], default=None)

    def ratio(a: str | None, b: str | None) -> float | None:
        if a is None or b is None:
            return None
        return rows[a]["tokens_per_s"] / rows[b]["tokens_per_s"]

    budgets = {}
    for label, fraction in BUDGETS.items():
        budget = fraction * ddp_bytes
        ranking = plan(
            model_config(), topo, budget, GRAD_ACCUM, links,
            compute_time_s=measured["compute_time_s"], dtype_bytes=4,
            collective=args.collective,
        )  # fmt: skip
        pick = next((r.strategy for r in ranking if r.fits and r.strategy in paro), None)
        budgets[label] = {
            "budget_bytes": int(budget),
            "fits": [n for n in rows if rows[n]["model_state_bytes"] <= budget],
            "best_paro": best(paro, budget),
            "best_default_baseline": best(default, budget),
            "best_tuned_baseline": best(tuned, budget),
            "best_baseline": best(default + tuned, budget),
            "planner_pick": pick,
            "planner_ranking": [
                {"strategy": r.strategy, "fits": r.fits, "predicted_step_s": r.step_time_s,
                 "predicted_memory_bytes": r.memory_bytes}
                for r in ranking
            ],
        }  # fmt: skip
    for row in rows.values():
        row["vs_ddp_default"] = row["tokens_per_s"] / rows["ddp_default"]["tokens_per_s"]
    b50, b35 = budgets["b50"], budgets["b35"]
    return {
        "benchmark": "PaRO strategies vs DDP / FSDP2 / HSDP, grad_accum 4",
        "where": where,
        "model": {"config": dataclasses.asdict(model_config()), "dtype": "float32"},
        "batch": {"micro_batch": MICRO_BATCH, "seq_len": SEQ_LEN, "grad_accum": GRAD_ACCUM},
        "collective": args.collective,
        "rounds": args.rounds,
        "timed_steps_per_round": args.steps,
        "links_calibrated": measured["links"],
        "compute_time_s": measured["compute_time_s"],
        "rows": rows,
        "budgets": budgets,
        "ratios": {
            "best_vs_default_b50": ratio(b50["best_paro"], b50["best_default_baseline"]),
            "best_vs_tuned_b50": ratio(b50["best_paro"], b50["best_tuned_baseline"]),
            "best_vs_baselines_b35": ratio(b35["best_paro"], b35["best_baseline"]),
            "planner_pick_vs_best_b50": ratio(b50["planner_pick"], b50["best_paro"]),
            "planner_pick_vs_best_b35": ratio(b35["planner_pick"], b35["best_paro"]),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.paro", description=__doc__)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--procs-per-node", type=int, default=2)
    parser.add_argument("--inter-gbit", type=float, default=1.0)
    parser.add_argument(
        "--steps", type=int, default=2, help="timed optimizer steps per configuration and round"
    )
    parser.add_argument("--rounds", type=int, default=2, help="turns every configuration takes")
    parser.add_argument("--collective", default="native", choices=("native", "hier", "horing"))
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--localhost", action="store_true", help="plain gloo, no emulation")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    topo = Topology(args.nodes, args.procs_per_node)
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "bench.paro", "--worker", "--result", str(result),
               "--steps", str(args.steps), "--rounds", str(args.rounds),
               "--collective", args.collective,
               "--strategies", *args.strategies]  # fmt: skip
        if args.localhost:
            where = {"mode": "localhost gloo on loopback, NOT the emulated cluster"}
            status = _run_localhost(cmd, topo, args.timeout)
        else:
            if os.geteuid() != 0:
                parser.error("the emulated cluster needs root; use --localhost without it")
            import bench.cluster as emulated

            # bench.cluster's namespace names are global and its `down` kills whatever runs in
            # them, so another benchmark bringing its own cluster up or down would end this
            # one: this run gets namespaces of its own (bench.cluster reads the name from the
            # environment, here and in every rank it starts)
            os.environ["RINGSIDE_CLUSTER"] = PARO_CLUSTER
            spec = emulated.ClusterSpec(args.nodes, args.procs_per_node, args.inter_gbit)
            where = {"mode": "emulated cluster (bench.cluster)", **dataclasses.asdict(spec)}
            with emulated.cluster(spec):
                status = emulated.run(cmd, timeout=args.timeout, port=PORT)
        if status:
            print(f"bench.paro: a rank failed with status {status}", file=sys.stderr)
            return status
        measured = json.loads(result.read_text())
    where["load_average_after"] = os.getloadavg()
    print(json.dumps(report(measured, topo, args, where), indent=2))
    return 0


def _run_localhost(cmd: list[str], topo: Topology, timeout: float) -> int:
    import subprocess

    procs = []
    for rank in range(topo.world_size):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(PORT),
               "WORLD_SIZE": str(topo.world_size), "RANK": str(rank),
               "LOCAL_RANK": str(topo.local_rank_of(rank)),
               "LOCAL_WORLD_SIZE": str(topo.procs_per_node)}  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env))
    deadline = time.monotonic() + timeout
    status = 0
    for p in procs:
        try:
            status = status or p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            status = 124
    return status


if __name__ == "__main__":
    sys.exit(main())
