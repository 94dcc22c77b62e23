"""A rank's data file is a safetensors file: any safetensors reader opens it and finds the
rank's flat shards and its pickled extras, byte for byte."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from engine.checkpoint import Checkpointer
from engine.checkpoint.shardfile import EXTRAS, layout

torch.set_num_threads(1)


def test_a_saved_file_opens_with_safetensors_with_every_shard_and_the_extras(tmp_path):
    # odd sizes of every element size: the layout must leave no gap, which safetensors refuses
    shards = {
        "mask": torch.tensor([True, False, True]),
        "half": torch.randn(5).to(torch.bfloat16),
        "counts": torch.arange(7, dtype=torch.int64),
        "params": torch.randn(3),
        "empty": torch.empty(0),
    }
    ckpt = Checkpointer(tmp_path, rank=1, world_size=2, run_id="st", memory_dir=None)
    ckpt.save(3, {name: (t, 10, 20) for name, t in shards.items()}, {"step": 3})
    ckpt.close()
    [file] = tmp_path.glob("step-000003/*.rank-00001.safetensors")
    loaded = load_file(file)
    assert set(loaded) == {*shards, EXTRAS}
    for name, t in shards.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t)
    assert pickle.loads(loaded[EXTRAS].numpy().tobytes()) == {"step": 3}
    with safe_open(file, "pt") as f:
        meta = f.metadata()
        assert torch.equal(f.get_slice("counts")[2:4], shards["counts"][2:4])
    assert (meta["step"], meta["rank"], meta["world_size"]) == ("3", "1", "2")
    assert json.loads(meta["shards"])["params"] == [10, 20]  # global offset and length


def test_each_shard_starts_at_a_multiple_of_its_element_size_and_the_data_on_a_line():
    shards = {"a": torch.zeros(3, dtype=torch.int8), "b": torch.zeros(1, dtype=torch.float16),
              "c": torch.zeros(1, dtype=torch.float64)}
    header, offsets, size = layout(shards, 5, {})
    data = len(header)
    assert data % 64 == 0 and size == data + 3 + 2 + 8 + 5
    assert all((offsets[n] - data) % t.element_size() == 0 for n, t in shards.items())
    assert offsets[EXTRAS] == size - 5


def test_a_dtype_safetensors_cannot_name_is_refused_with_the_tensor():
    with pytest.raises(ValueError, match=r"tensors\['z'\]: dtype torch.complex128"):
        layout({"z": torch.zeros(2, dtype=torch.complex128)}, 0, {})
