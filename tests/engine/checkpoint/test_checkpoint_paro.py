"""With PaRO's ShardedDataParallel on real gloo ranks: the state of IIG on 2x2 after two steps
restores exactly into GGG on 1x2, through `sharded_state()` and `load_sharded_state(read)`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from engine.checkpoint import Checkpointer, restore
from engine.horing.topology import Topology
from engine.paro import ShardedDataParallel
from tests.engine.ranks import run_ranks

VOCAB, SEQ, MICRO_BATCH = 29, 6, 2


@dataclass
class Output:
    loss: torch.Tensor


class SmallLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 12)
        self.out = nn.Linear(12, VOCAB)  # 709 parameters: padded for 4 and for 2 ranks

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Output:
        logits = self.out(torch.tanh(self.embed(input_ids)))
        return Output(F.cross_entropy(logits.flatten(0, 1), labels.flatten()))


def gathered(dp: ShardedDataParallel) -> dict[str, torch.Tensor]:
    pieces = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, dp.sharded_state())
    full = {}
    for kind, (_, _, length) in pieces[0].items():
        full[kind] = torch.full((length,), float("nan"))
        for piece in pieces:
            values, offset, _ = piece[kind]
            full[kind][offset : offset + values.numel()] = values
    return full


def worker(nodes: int, strategy: str, tmp: str) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    topo = Topology(nodes, world // nodes).init_groups()
    torch.manual_seed(world)  # the restoring world starts from other weights
    dp = ShardedDataParallel(SmallLM(), topo, strategy, lr=1e-2)
    if world == 4:
        ckpt = Checkpointer(Path(tmp, "ckpt"), rank=rank, world_size=world, memory_dir=None,
                            meta={"strategy": strategy, "nodes": nodes})
        for step in (1, 2):
            tokens = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ + 1),
                                   generator=torch.Generator().manual_seed(step * 10 + rank))
            dp.forward_backward(tokens[:, :-1], tokens[:, 1:])
            dp.step(1e-2, 1.0)
        ckpt.save(2, dp.sharded_state(), {"adam_step": dp.adam_step})
        ckpt.close()
        expected = gathered(dp)
        if rank == 0:
            torch.save(expected, Path(tmp, "expected.pt"))
    else:
        restored = restore([Path(tmp, "ckpt")], lambda reader: dp.load_sharded_state(reader.read))
        dp.adam_step = restored.extras(0)["adam_step"]
        assert restored.step == 2 and restored.checkpoint.meta["strategy"] == "IIG"
        assert dp.adam_step == 2
        expected = torch.load(Path(tmp, "expected.pt"))
        for kind, values in gathered(dp).items():
            assert torch.equal(values, expected[kind]), kind
        with dp.full_parameters() as model:
            params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        assert torch.equal(params, expected["params"])


def test_iig_on_2x2_restores_into_ggg_on_1x2(tmp_path):
    run_ranks(worker, 2, "IIG", str(tmp_path), nodes=2, procs_per_node=2, timeout_s=60)
    run_ranks(worker, 1, "GGG", str(tmp_path), nodes=1, procs_per_node=2, timeout_s=60)
