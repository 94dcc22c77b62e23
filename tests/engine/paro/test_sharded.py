"""ShardedDataParallel on real gloo worlds (2x2 and 2x4 ranks on this host).

Each world is spawned once; every rank trains a small LM with each of the ten strategies at
grad_accum 1 and 4, with the batch shared evenly and rebalanced (uneven shares, each rank's
gradient weighted by its share), and records what it saw. The tests then hold those records
against a single-process torch.optim.AdamW reference on the same global batches, against the
memory formulas of spec section 4 and against the communication table of spec section 5.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from engine.contract import STRATEGIES
from engine.data.loader import split_evenly
from engine.horing.topology import Topology
from engine.paro import ShardedDataParallel, parse_strategy
from engine.ports import free_port
from tests.engine.ranks import run_ranks

# 3 steps: Adam's moments and bias correction past their first step, and a step with the
# gradient clipped beside ones without (test_clipping_was_active)
STEPS, MICRO_BATCH, SEQ, VOCAB = 3, 2, 8, 37
LR, CLIP = 1e-3, 0.4
ACCUMS = (1, 4)
WORLDS = [(2, 2), (2, 4)]  # nodes x procs_per_node
# global all-reduce, reduce-scatter + all-gather, and the parameter gathers
HORING_STRATEGIES = ("NNN", "NGG", "GGG")
# uneven samples per rank and step (the even share is MICRO_BATCH x grad_accum), as a
# rebalanced straggler's run has them: every rank keeps at least one per micro-step
REBALANCED = {(4, 1): [4, 2, 1, 1], (4, 4): [14, 10, 4, 4],
              (8, 1): [4, 3, 2, 2, 2, 1, 1, 1], (8, 4): [16, 12, 8, 8, 6, 6, 4, 4]}


@dataclass
class Output:
    loss: torch.Tensor
    ce_loss: torch.Tensor


class TinyLM(nn.Module):
    """The MoE model's call convention, model(input_ids, labels) -> .loss; 1957 parameters,
    so the flat buffer needs padding for both world sizes."""

    def __init__(self, hidden_layers: int = 0) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.norm = nn.LayerNorm(16)
        self.up = nn.Linear(16, 24)
        self.hidden = nn.ModuleList(nn.Linear(24, 24) for _ in range(hidden_layers))
        self.down = nn.Linear(24, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Output:
        x = torch.tanh(self.up(self.norm(self.embed(input_ids))))
        for layer in self.hidden:
            x = torch.tanh(layer(x))
        logits = self.down(x)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return Output(loss, loss.detach())


def global_batch(step: int, micro: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + micro)
    tokens = torch.randint(0, VOCAB, (world * MICRO_BATCH, SEQ + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def reference(world: int, accum: int) -> dict:
    """One process, the whole global batch, torch's AdamW and clip_grad_norm_."""
    torch.manual_seed(0)
    model = TinyLM()
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    vectors = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
        lr=LR,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    losses, norms = [], []
    for step in range(STEPS):
        total = 0.0
        for micro in range(accum):
            out = model(*global_batch(step, micro, world))
            (out.loss / accum).backward()
            total += out.loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(total / accum)
    return {"losses": losses, "norms": norms, "params": [p.detach() for p in model.parameters()]}


def train_every_strategy(nodes: int) -> dict:
    """What this rank saw, per (strategy, grad_accum) and per (strategy, collective)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    topo = Topology(nodes, world // nodes).init_groups()
    mine = slice(rank * MICRO_BATCH, (rank + 1) * MICRO_BATCH)
    records = {}
    previous_state = None
    for accum in ACCUMS:
        for name in STRATEGIES:
            torch.manual_seed(0)
            dp = ShardedDataParallel(TinyLM(), topo, name, lr=LR, grad_accum=accum)
            losses, norms = [], []
            for step in range(STEPS):
                total = torch.zeros(())
                for micro in range(accum):
                    ids, labels = global_batch(step, micro, world)
                    total += dp.forward_backward(ids[mine], labels[mine]).loss.detach()
                norms.append(dp.step(LR, CLIP))
                dist.all_reduce(total)
                losses.append(total.item() / (world * accum))
            comm = dp.comm_stats()
            with dp.full_parameters() as model:
                params = [p.detach().clone() for p in model.parameters()]
            state = dp.sharded_state()
            pieces = [None] * world
            dist.all_gather_object(pieces, state)
            records[name, accum] = {
                "losses": losses,
                "norms": norms,
                "params": params,
                "pieces": pieces,
                "comm": comm,
                "state_bytes": dp.state_bytes(),
                "padded": dp.layout.padded,
                "numel": dp.layout.numel,
            }
            # reshard: this strategy restores the previous strategy's final state
            if previous_state is not None:
                dp.load_sharded_state(lambda kind, off, n, s=previous_state: s[kind][off : off + n])
                with dp.full_parameters() as model:
                    records[name, accum]["restored"] = torch.cat(
                        [p.detach().reshape(-1) for p in model.parameters()]
                    )
                records[name, accum]["restored_state"] = dp.sharded_state()
            previous_state = assemble(pieces)
    for accum in ACCUMS:
        for name in STRATEGIES:
            records[name, accum, "rebalanced"] = train_rebalanced(topo, name, accum)
    for collective in ("ring", "horing"):
        for name in HORING_STRATEGIES:
            torch.manual_seed(0)
            dp = ShardedDataParallel(TinyLM(), topo, name, lr=LR, collective=collective)
            for step in range(STEPS):
                ids, labels = global_batch(step, 0, world)
                dp.forward_backward(ids[mine], labels[mine])
                dp.step(LR, CLIP)
            comm = dp.comm_stats()
            with dp.full_parameters() as model:
                params = [p.detach().clone() for p in model.parameters()]
            records[name, collective] = {"params": params, "comm": comm}
    return records


def train_rebalanced(topo: Topology, name: str, accum: int) -> dict:
    """The reference's steps with REBALANCED shares: this rank takes its block of the step's
    rows, spread over the micro-steps, each micro-batch weighted by samples x world / batch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    shares = REBALANCED[world, accum]
    first = sum(shares[:rank])
    torch.manual_seed(0)
    dp = ShardedDataParallel(TinyLM(), topo, name, lr=LR, grad_accum=accum)
    for step in range(STEPS):
        batches = [global_batch(step, micro, world) for micro in range(accum)]
        ids, labels = (torch.cat(part)[first : first + shares[rank]]
                       for part in zip(*batches, strict=True))
        at = 0
        for n in split_evenly(shares[rank], accum):
            dp.forward_backward(ids[at : at + n], labels[at : at + n],
                                weight=Fraction(n * world, sum(shares)))
            at += n
        dp.step(LR, CLIP)
    with dp.full_parameters() as model:
        return {"params": [p.detach().clone() for p in model.parameters()]}


def assemble(pieces: list[dict]) -> dict[str, torch.Tensor]:
    """The global flat buffers from every rank's sharded_state()."""
    numel = pieces[0]["params"][2]
    out = {}
    for kind in pieces[0]:
        flat = torch.full((numel,), float("nan"))
        for piece in pieces:
            values, offset, length = piece[kind]
            assert length == numel
            flat[offset : offset + values.numel()] = values
        out[kind] = flat
    return out


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"{w[0]}x{w[1]}")
def world(request) -> dict:
    nodes, per_node = request.param
    ranks = run_ranks(train_every_strategy, nodes, nodes=nodes, procs_per_node=per_node,
                      timeout_s=180)
    return {"nodes": nodes, "per_node": per_node, "size": nodes * per_node, "ranks": ranks}


def test_every_strategy_matches_a_single_process_reference(world):
    for accum in ACCUMS:
        ref = reference(world["size"], accum)
        for name in STRATEGIES:
            for rank, records in enumerate(world["ranks"]):
                got = records[name, accum]
                where = f"{name} grad_accum={accum} rank {rank}"
                torch.testing.assert_close(
                    got["losses"],
                    ref["losses"],
                    rtol=1e-5,
                    atol=0,
                    msg=lambda m, w=where: f"{w} loss: {m}",
                )
                torch.testing.assert_close(
                    got["norms"],
                    ref["norms"],
                    rtol=1e-5,
                    atol=0,
                    msg=lambda m, w=where: f"{w} grad norm: {m}",
                )
                for p, r in zip(got["params"], ref["params"], strict=True):
                    torch.testing.assert_close(
                        p, r, rtol=1e-5, atol=1e-7, msg=lambda m, w=where: f"{w} params: {m}"
                    )


def test_rebalanced_shares_give_every_strategy_the_balanced_update(world):
    """The spec's correctness rule: with each rank's gradient weighted by its share, uneven
    shares of the same samples step to the same parameters, for every strategy's reduction
    (plain and weighted reduce-scatter alike) and with accumulation."""
    for accum in ACCUMS:
        ref = reference(world["size"], accum)
        for name in STRATEGIES:
            for rank, records in enumerate(world["ranks"]):
                where = f"{name} grad_accum={accum} rank {rank} rebalanced"
                for p, r in zip(records[name, accum, "rebalanced"]["params"], ref["params"],
                                strict=True):
                    torch.testing.assert_close(
                        p, r, rtol=1e-5, atol=1e-7, msg=lambda m, w=where: f"{w} params: {m}")


def test_clipping_was_active():
    """The reference clips on some steps and not on others, so the tests above check both."""
    norms = reference(4, 1)["norms"]
    assert min(norms) < CLIP < max(norms)


def test_state_bytes_follow_the_memory_formula(world):
    """Spec section 4 with the engine's CPU element sizes: 4 bytes per parameter and per
    gradient, 8 per parameter of optimizer state (Adam's m and v; fp32 parameters are their
    own master weights); f_N = 1, f_I = 1/g, f_G = 1/N, over the flat buffer padded to a
    multiple of N."""
    g, n = world["per_node"], world["size"]
    share = {"N": 1, "I": g, "G": n}
    for name in STRATEGIES:
        s = parse_strategy(name)
        for records in world["ranks"]:
            got = records[name, 1]
            psi = got["padded"]
            assert psi % n == 0 and psi - got["numel"] < n
            assert got["state_bytes"] == {
                "params": 4 * psi // share[s.params],
                "grads": 4 * psi // share[s.grads],
                "optim": 8 * psi // share[s.optim],
            }, name


# Spec section 5, per optimizer step with A micro-steps: inter bytes in units of
# (R-1)/R * b*S/g, intra bytes in units of (g-1)/g * b*S (Psi = Psi' = S), inter collectives.
SCHEDULE = {
    "NNN": lambda A: (2, 1, 2),
    "NNG": lambda A: (2, 2, 2),
    "NGG": lambda A: (A + 1, A + 1, A + 1),
    "GGG": lambda A: (3 * A, 3 * A, 3 * A),
    "NII": lambda A: (2, 1, A + 1),
    "NIG": lambda A: (2, 2, A + 1),
    "IIG": lambda A: (2, 2, 3 * A),
    "IGG": lambda A: (A + 1, A + 1, 3 * A),
    "ING": lambda A: (2, 2, 2 * A + 1),
    "III": lambda A: (2, 1, 3 * A),
}


def test_communication_follows_the_schedule_table(world):
    g, groups, b = world["per_node"], world["nodes"], 4  # fp32 on CPU
    for key, got in world["ranks"][0].items():
        if len(key) != 2 or key[1] not in ACCUMS:
            continue
        name, accum = key
        inter_units, inter_calls, intra_units = SCHEDULE[name](accum)
        size = got["padded"] * b
        expected = {
            "inter_bytes": inter_units * (groups - 1) * size // (groups * g),
            "inter_calls": inter_calls,
            "intra_bytes": intra_units * (g - 1) * size // g,
            # every intra collective moves (g-1)/g of one full buffer
            "intra_calls": intra_units,
        }
        for records in world["ranks"]:
            assert records[name, accum]["comm"] == expected, (name, accum)


def test_sharded_state_tiles_the_buffer_and_reshards_into_every_strategy(world):
    records = world["ranks"]
    order = [(name, accum) for accum in ACCUMS for name in STRATEGIES]
    for before, after in zip(order, order[1:], strict=False):
        saved = assemble(records[0][before]["pieces"])
        assert not any(t.isnan().any() for t in saved.values()), f"{before}: pieces leave gaps"
        final = torch.cat([p.reshape(-1) for p in records[0][before]["params"]])
        torch.testing.assert_close(saved["params"], final, rtol=0, atol=0)
        for rank, r in enumerate(records):
            torch.testing.assert_close(
                r[after]["restored"],
                final,
                rtol=0,
                atol=0,
                msg=lambda m, a=after, k=rank: f"{a} rank {k}: {m}",
            )
            for kind, (values, offset, _) in r[after]["restored_state"].items():
                torch.testing.assert_close(values, saved[kind][offset : offset + values.numel()])


def test_horing_collectives_train_the_same_model_and_send_the_same_volume(world):
    ref = reference(world["size"], 1)
    for name in HORING_STRATEGIES:
        for collective in ("ring", "horing"):
            for records in world["ranks"]:
                got = records[name, collective]
                assert got["comm"] == records[name, 1]["comm"], (name, collective)
                for p, r in zip(got["params"], ref["params"], strict=True):
                    torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-7)


@pytest.fixture
def single_rank():
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield Topology(1, 1).init_groups()
    dist.destroy_process_group()


def test_bad_arguments_are_rejected_by_name(single_rank):
    with pytest.raises(ValueError, match="strategy must be one of NNN, NNG"):
        ShardedDataParallel(TinyLM(), single_rank, "GNN", lr=LR)
    with pytest.raises(ValueError, match="collective must be one of native, ring"):
        ShardedDataParallel(TinyLM(), single_rank, "NNN", lr=LR, collective="nccl")
    with pytest.raises(ValueError, match="grad_accum"):
        ShardedDataParallel(TinyLM(), single_rank, "NNN", lr=LR, grad_accum=0)
    with pytest.raises(ValueError, match="topo: call Topology.init_groups"):
        ShardedDataParallel(TinyLM(), Topology(1, 1), "NNN", lr=LR)


def test_step_refuses_an_incomplete_accumulation(single_rank):
    dp = ShardedDataParallel(TinyLM(), single_rank, "IIG", lr=LR, grad_accum=2)
    ids, labels = global_batch(0, 0, 1)
    dp.forward_backward(ids, labels)
    with pytest.raises(RuntimeError, match="after 1 forward_backward.*grad_accum is 2"):
        dp.step(LR, CLIP)
    dp.forward_backward(ids, labels)
    with pytest.raises(RuntimeError, match="3 times before step"):
        dp.forward_backward(ids, labels)
    assert dp.step(LR, CLIP) > 0


def test_bf16_parameters_step_fp32_master_weights_and_follow_them(single_rank):
    """As the engine trains on a GPU: the optimizer updates an fp32 copy and the bf16
    parameters are that copy rounded, so updates smaller than a bf16 step still add up."""
    torch.manual_seed(0)
    model = TinyLM().to(torch.bfloat16)
    dp = ShardedDataParallel(model, single_rank, "NNN", lr=LR)
    batch, losses = global_batch(0, 0, 1), []
    for _ in range(10):
        losses.append(dp.forward_backward(*batch).loss.item())
        dp.step(LR, CLIP)
    master, _, length = dp.sharded_state()["params"]
    assert master.dtype == torch.float32
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert flat.dtype == torch.bfloat16
    assert torch.equal(flat, master[:length].to(torch.bfloat16))
    assert not torch.equal(master[:length], flat.float())  # the master holds more than bf16
    assert dp.state_bytes()["optim"] == 3 * 4 * dp.layout.padded  # master, m, v in fp32
    assert losses[-1] < losses[0]


def copies(run) -> int:
    """aten::copy_ calls while `run()` runs (a copy per parameter shows as one per parameter)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return sum(e.name == "aten::copy_" for e in prof.events())


def test_the_step_copies_no_parameter_one_by_one(single_rank):
    """Backward writes the gradients into the flat buffer itself and the step works on flat
    buffers: a micro-step copies no more than the model's own forward and backward do, and an
    optimizer step's copies do not grow with the parameter count (bf16 parameters, so the step
    also converts fp32 master weights back)."""
    step_copies = []
    batch = global_batch(0, 0, 1)
    for hidden_layers in (0, 6):
        torch.manual_seed(0)
        model = TinyLM(hidden_layers).to(torch.bfloat16)
        # the model's own forward and backward of the loss weighted 1 / grad_accum, as a
        # micro-step weights it
        own = copies(lambda m=model: (m(*batch).loss * 1 / 2).backward())
        model.zero_grad()
        dp = ShardedDataParallel(model, single_rank, "NNN", lr=LR, grad_accum=2)
        dp.forward_backward(*batch)
        assert copies(lambda d=dp: d.forward_backward(*batch)) == own
        # every gradient lives in one flat buffer
        assert len({p.grad.untyped_storage().data_ptr() for p in model.parameters()}) == 1
        step_copies.append(copies(lambda d=dp: d.step(LR, CLIP)))
    assert len(list(TinyLM(6).parameters())) == len(list(TinyLM().parameters())) + 12
    assert step_copies[0] == step_copies[1] <= 6
