"""The train state: everything the loop must resume with survives a round trip, alone and as
the checkpointer's "train" part."""

import torch
from torch import nn

from engine.anomaly import Anomaly, FaultManager
from engine.checkpoint import Checkpointer, open_checkpoint, read_extras
from engine.data.loader import TokenLoader
from engine.runtime.spec import parse_spec
from engine.runtime.state import TrainState


class Optimizer:
    adam_step = 0
    weight_decay = 0.1

    def set_weight_decay(self, weight_decay: float) -> None:
        self.weight_decay = weight_decay


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2, 2))
        self.register_buffer("expert_bias", torch.zeros(4))


def train_state() -> TrainState:
    loader = TokenLoader(torch.arange(4096), seq_len=8, micro_batch=2, rank=0, world_size=1,
                         seed=3)
    return TrainState(Model(), Optimizer(), loader, FaultManager(),
                      parse_spec({"name": "t", "train": {"lr": 1e-3}}))


def advance(state: TrainState) -> None:
    """What training does to the state."""
    state.step, state.tokens = 12, 4096
    state.optimizer.adam_step = 12
    state.loader.next_batch()
    state.model.expert_bias += 0.5
    state.faults.ladder.decide([Anomaly("nan", "error", 12)], 12, now=100.0)
    state.settings.change({"train.lr": 5e-4, "train.weight_decay": 0.0})
    torch.rand(3)


def test_a_round_trip_restores_everything_the_loop_resumes_with():
    saved = train_state()
    advance(saved)
    snapshot = saved.state_dict()
    expected_draw = torch.rand(3)

    restored = train_state()
    restored.load_state_dict(snapshot)

    assert (restored.step, restored.tokens, restored.optimizer.adam_step) == (12, 4096, 12)
    assert restored.loader.position == saved.loader.position > 0
    assert torch.equal(restored.model.expert_bias, torch.full((4,), 0.5))
    assert restored.faults.state_dict() == saved.faults.state_dict()
    assert restored.faults.ladder.rung == {"nan": 0}
    # the live settings come back over the spec, and reach the optimizer again
    assert restored.settings.spec.train.lr == 5e-4
    assert restored.optimizer.weight_decay == 0.0
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG continues where it was saved


def test_the_state_dict_holds_buffers_but_not_parameters():
    buffers = train_state().state_dict()["buffers"]
    assert set(buffers) == {"expert_bias"}


def test_the_checkpointer_saves_and_loads_it_as_its_train_part(tmp_path):
    saved = train_state()
    advance(saved)
    ckpt = Checkpointer(tmp_path, memory_dir=None, run_id="r", parts={"train": saved})
    ckpt.save(saved.step, {"w": (torch.ones(4), 0, 4)})
    ckpt.wait()
    assert read_extras(tmp_path, 0)["train"]["step"] == 12  # the extras stay readable

    restored = train_state()
    loader = Checkpointer(tmp_path, memory_dir=None, run_id="r2", parts={"train": restored})
    with open_checkpoint(tmp_path) as reader:
        loader.load_parts(reader)
    assert (restored.step, restored.loader.position) == (12, saved.loader.position)
    ckpt.close()
    loader.close()
