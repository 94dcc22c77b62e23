"""Injected faults on a 2x2 gloo run of the real nano MoE model, wired the way the training
loop wires the components: each fault is detected in its step (the straggler within 10),
named on the right rank, answered by the default policy, and the loss recovers."""

from __future__ import annotations

import json
import math
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.anomaly import FaultInjector, FaultManager
from engine.horing import Topology
from engine.moe.config import preset
from engine.moe.model import MoEModel
from engine.runtime.data import TokenLoader, load_tokens
from engine.runtime.spec import DatasetSpec, FaultInjection, FaultPolicy
from engine.xputimer import OpAggregator, OpTimer

WORLD, STEPS = 4, 36
INJECT = [FaultInjection("loss_spike", step=12, rank=1, factor=10.0),
          FaultInjection("nan", step=18, rank=2),
          FaultInjection("slow_rank", step=24, rank=3, factor=6.0)]


def rank_main(rank: int, port: int, out: str, tokens: torch.Tensor) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    Topology(2, 2).init_groups()
    torch.manual_seed(0)
    model = MoEModel(preset("nano"))
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=3e-3)
    loader = TokenLoader(tokens, 64, 4, rank, WORLD, seed=0)
    timer, aggregator = OpTimer(rank), OpAggregator()
    injector = FaultInjector(INJECT, rank)
    faults = FaultManager(FaultPolicy(), rank)
    prev_ops, log = None, []
    for step in range(1, STEPS + 1):
        with timer.op("data", "data"):
            input_ids, labels = loader.next_batch()
        with timer.op("forward"), injector.slowdown(step):
            output = model(input_ids, labels)
        loss = injector.corrupt_loss(step, output.loss)
        with timer.op("backward"), injector.slowdown(step):
            loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        with timer.op("grad_all_reduce", "collective", nbytes=flat.numel() * 4, group="global",
                      algo="native", collective="all_reduce", group_size=WORLD):
            dist.all_reduce(flat)
        torch.nn.utils.vector_to_parameters(flat / WORLD, [p.grad for p in params])
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        anomalies, decisions = faults.step(step, loss=loss.item(), grad_norm=grad_norm.item(),
                                           aggregate=prev_ops)
        if not decisions or decisions[0].action == "observe":
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        prev_ops = aggregator.aggregate(timer.step_end(step))
        log.append({"step": step, "loss": output.ce_loss.item(),
                    "compute_ms": [r["compute_ms"] for r in prev_ops["ranks"]],
                    "anomalies": [[a.kind, a.rank] for a in anomalies],
                    "actions": [[d.action, d.anomaly, d.rank] for d in decisions]})
    with open(f"{out}/log-{rank}.json", "w") as f:
        json.dump(log, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    tokens = load_tokens(DatasetSpec()).train  # once, shared with the forked ranks
    out = tmp_path_factory.mktemp("faults")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(rank_main, args=(port, str(out), tokens), nprocs=WORLD,
                       start_method="fork")
    return [json.loads((out / f"log-{r}.json").read_text()) for r in range(WORLD)]


def events(log: list[dict]) -> dict[int, dict]:
    return {e["step"]: e for e in log if e["anomalies"]}


def test_all_ranks_decide_alike(logs):
    assert all([e["actions"] for e in log] == [e["actions"] for e in logs[0]] for log in logs)


def test_loss_spike_is_caught_in_its_step_on_its_rank_and_the_update_skipped(logs):
    spike = events(logs[0])[12]
    assert ["loss_spike", 1] in spike["anomalies"]
    assert spike["actions"][0] == ["skip_update", "loss_spike", 1]


def test_nan_is_caught_in_its_step_on_its_rank(logs):
    nan = events(logs[0])[18]
    assert nan["anomalies"][0] == ["nan", 2]
    assert nan["actions"][0] == ["skip_update", "nan", 2]


def test_slowed_rank_is_named_a_straggler_within_10_steps(logs):
    stragglers = [(s, e["anomalies"]) for s, e in events(logs[0]).items()
                  if any(kind == "straggler" for kind, _ in e["anomalies"])]
    assert stragglers and all(s >= 24 for s, _ in stragglers)
    first_step, anomalies = stragglers[0]
    assert first_step <= 24 + 10 and ["straggler", 3] in anomalies


def test_no_other_anomalies_and_the_loss_recovers(logs):
    seen = {(s, kind) for s, e in events(logs[0]).items() for kind, _ in e["anomalies"]}
    assert {kind for _, kind in seen} <= {"loss_spike", "grad_spike", "nan", "straggler"}
    assert {s for s, kind in seen if kind != "straggler"} <= {12, 18}
    losses = [e["loss"] for e in logs[0]]
    assert all(math.isfinite(x) for x in losses[18:])
    assert max(losses[-5:]) < losses[10] < losses[0]
