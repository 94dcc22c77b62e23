"""Reshard on load: a checkpoint saved by one layout and world size loads into any other.

Simulated ranks in one process (test_checkpoint_paro.py does it with real gloo ranks). The
shards follow PaRO's nested layout: the I partition splits a flat buffer among the
procs of a node (replicated across nodes), the G partition splits each I piece further
across the nodes of its rail, and N is replicated. One rank of each replica set saves.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from engine.checkpoint import (
    Checkpointer,
    CheckpointError,
    CorruptCheckpoint,
    find_latest_good,
    load,
    load_into,
    read_extras,
    restore,
)
from engine.checkpoint.layout import BLOCK_BYTES

torch.set_num_threads(1)

FORMAT_1 = Path(__file__).parent / "data" / "format-1"
LENGTHS = {"params": 1003, "exp_avg": 1003, "step_scale": 7}


def full_state(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {
        "params": torch.randn(LENGTHS["params"], generator=g),
        "exp_avg": torch.randn(LENGTHS["exp_avg"], generator=g),
        "step_scale": torch.randn(LENGTHS["step_scale"], generator=g).to(torch.bfloat16),
    }


def span(length: int, parts: int, index: int) -> tuple[int, int]:
    """Uneven contiguous split, as torch.tensor_split does: (offset, numel) of piece index."""
    base, extra = divmod(length, parts)
    offset = index * base + min(index, extra)
    return offset, base + (index < extra)


def paro_span(length: int, nodes: int, procs: int, rank: int, letter: str) -> tuple[int, int]:
    node, local = divmod(rank, procs)
    if letter == "N":
        return 0, length
    i_offset, i_numel = span(length, procs, local)
    if letter == "I":
        return i_offset, i_numel
    g_offset, g_numel = span(i_numel, nodes, node)
    return i_offset + g_offset, g_numel


def saves_it(nodes: int, procs: int, rank: int, letter: str) -> bool:
    """One rank of each replica set writes: rank 0 for N, node 0 for I, everyone for G."""
    node, _ = divmod(rank, procs)
    return letter == "G" or (letter == "I" and node == 0) or rank == 0


def sharded(full, nodes, procs, rank, strategy, saving=False):
    """`full` cut as rank `rank` of a nodes x procs layout holds it; `strategy` maps name to
    N/I/G. For saving, only what this rank writes; for loading, every piece it owns."""
    state = {}
    for name, letter in strategy.items():
        if saving and not saves_it(nodes, procs, rank, letter):
            continue
        offset, numel = paro_span(len(full[name]), nodes, procs, rank, letter)
        state[name] = (full[name][offset : offset + numel].clone(), offset, len(full[name]))
    return state


IIG = {"params": "I", "exp_avg": "G", "step_scale": "N"}  # 2x2 save layout
GGG = {"params": "G", "exp_avg": "G", "step_scale": "G"}
NNN = {"params": "N", "exp_avg": "N", "step_scale": "N"}


def save_simulated_world(directory: Path, nodes: int, procs: int, step: int) -> None:
    """All ranks of a layout in this process (each its own Checkpointer and thread)."""
    world = nodes * procs
    ranks = [
        Checkpointer(directory, rank=r, world_size=world, run_id="sim", memory_dir=None)
        for r in range(world)
    ]
    full = full_state(step)
    for r, ckpt in enumerate(ranks):
        ckpt.save(step, sharded(full, nodes, procs, r, IIG, saving=True), {"rank": r})
    for ckpt in ranks:
        ckpt.close()


def assert_same_bytes(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize(("nodes", "procs", "strategy"), [(1, 2, GGG), (1, 1, NNN), (2, 3, IIG)])
def test_world_4_iig_loads_into_other_layouts_byte_for_byte(tmp_path, nodes, procs, strategy):
    save_simulated_world(tmp_path, nodes=2, procs=2, step=10)
    full = full_state(10)
    for rank in range(nodes * procs):
        targets = sharded({k: torch.empty_like(v) for k, v in full.items()}, nodes, procs, rank,
                          strategy)
        load_into(tmp_path, targets)
        for name, (shard, offset, _) in targets.items():
            assert_same_bytes(shard, full[name][offset : offset + shard.numel()])


def test_load_returns_any_ranges_and_each_saved_rank_keeps_its_extras(tmp_path):
    save_simulated_world(tmp_path, nodes=2, procs=2, step=3)
    full = full_state(3)
    got = load(tmp_path, {"params": [(0, 5), (250, 600)], "step_scale": [(6, 1)]})
    assert_same_bytes(got["params"][0], full["params"][:5])
    assert_same_bytes(got["params"][1], full["params"][250:850])
    assert_same_bytes(got["step_scale"][0], full["step_scale"][6:])
    assert [read_extras(tmp_path, r)["rank"] for r in range(4)] == [0, 1, 2, 3]


def test_restore_hands_a_reader_to_a_loader_that_asks_by_range(tmp_path):
    """The shape of ShardedDataParallel.load_sharded_state(read): read(name, offset, length)."""
    save_simulated_world(tmp_path, nodes=2, procs=2, step=5)
    full, asked = full_state(5), []

    def load_sharded_state(read):
        for name in ("params", "exp_avg"):
            asked.append(read(name, 100, 500))

    restored = restore([tmp_path], lambda reader: load_sharded_state(reader.read))
    assert restored.step == 5
    assert torch.equal(asked[0], full["params"][100:600])
    assert torch.equal(asked[1], full["exp_avg"][100:600])


def test_loading_reads_only_the_blocks_that_hold_the_wanted_range(tmp_path, monkeypatch):
    length = 3 * BLOCK_BYTES // 4 * 2  # 2 ranks x 3 blocks of float32 each
    full = torch.randn(length)
    for rank in range(2):
        ckpt = Checkpointer(tmp_path, rank=rank, world_size=2, run_id="big", memory_dir=None)
        half = length // 2
        ckpt.save(1, {"w": (full[rank * half : (rank + 1) * half], rank * half, length)})
        ckpt.close()
    reads = []
    real_preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, at: reads.append(at) or real_preadv(
        fd, bufs, at))
    # straddles the two ranks' files: one block from each (the files start with their
    # safetensors header, so rank 0's last elements are in its fourth block)
    wanted = (length // 2 - 10, 20)
    got = load(tmp_path, {"w": [wanted]})["w"][0]
    assert torch.equal(got, full[wanted[0] : wanted[0] + wanted[1]])
    assert sorted(reads) == [0, 3 * BLOCK_BYTES]

    assert torch.equal(load(tmp_path, {"w": [(0, length)]})["w"][0], full)
    victim = next(tmp_path.glob("step-000001/*.rank-00001.safetensors"))
    with open(victim, "r+b") as f:  # a whole block, read straight into the target
        f.seek(BLOCK_BYTES + 5)
        f.write(b"\xff")
    with pytest.raises(CorruptCheckpoint, match="block 1 fails its checksum"):
        load(tmp_path, {"w": [(0, length)]})


def test_wrong_targets_are_named_in_the_error(tmp_path):
    save_simulated_world(tmp_path, nodes=1, procs=1, step=1)
    with pytest.raises(CheckpointError, match="'nope' is not in"):
        load(tmp_path, {"nope": [(0, 1)]})
    with pytest.raises(CheckpointError, match="'params': target is torch.float16"):
        load_into(tmp_path, {"params": (torch.empty(3, dtype=torch.float16), 0, 1003)})
    with pytest.raises(CheckpointError, match="'params': target global length 999"):
        load_into(tmp_path, {"params": (torch.empty(3), 0, 999)})
    with pytest.raises(CheckpointError, match=r"'params': range \[1000, 1010\) is outside"):
        load(tmp_path, {"params": [(1000, 10)]})


def test_empty_shards_and_any_dtype_round_trip(tmp_path):
    """A rank may own nothing of a padded buffer; counters and masks travel as they are."""
    values = {
        "counts": torch.arange(5, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "half": torch.randn(4).half(),
    }
    for rank in range(2):
        ckpt = Checkpointer(tmp_path, rank=rank, world_size=2, run_id="dtypes", memory_dir=None)
        ckpt.save(1, {name: (t[:0], len(t), len(t)) if rank == 1 else (t, 0, len(t))
                      for name, t in values.items()})
        ckpt.close()
    got = load(tmp_path, {name: [(0, len(t))] for name, t in values.items()})
    for name, t in values.items():
        assert_same_bytes(got[name][0], t)


@pytest.mark.parametrize(("saved", "loaded"), [(4, 2), (1, 3)])
def test_a_world_saves_and_another_world_loads_every_byte(tmp_path, saved, loaded):
    full = full_state(8)
    savers = [Checkpointer(tmp_path, rank=r, world_size=saved, run_id="w", memory_dir=None)
              for r in range(saved)]
    for r, ckpt in enumerate(savers):
        ckpt.save(8, sharded(full, 1, saved, r, GGG, saving=True), {"rank": r})
    for ckpt in savers:
        ckpt.close()
    for rank in range(loaded):
        targets = sharded({k: torch.empty_like(v) for k, v in full.items()}, 1, loaded, rank, GGG)
        load_into(tmp_path, targets)
        for name, (shard, offset, _) in targets.items():
            assert_same_bytes(shard, full[name][offset : offset + shard.numel()])


def test_a_checkpoint_of_the_first_format_still_loads_resharded(tmp_path):
    """Written by the format-1 writer (raw shard bytes, then the extras): a run resumes from
    it across the upgrade, checksums checked, into another world size."""
    shutil.copytree(FORMAT_1, tmp_path / "format-1")
    directory = tmp_path / "format-1"
    expected = {"w": torch.arange(100, dtype=torch.float32) / 8,
                "b": (torch.arange(7) - 3).to(torch.bfloat16)}
    info, _ = find_latest_good(directory, verify=True)
    assert info.good and info.step == 7 and info.manifest["format"] == 1
    for rank in range(3):
        offset, numel = span(100, 3, rank)
        target = torch.empty(numel)
        load_into(directory, {"w": (target, offset, 100)})
        assert_same_bytes(target, expected["w"][offset : offset + numel])
    assert_same_bytes(load(directory, {"b": [(0, 7)]})["b"][0], expected["b"])
    assert [read_extras(directory, r) for r in (0, 1)] == [{"step": 7, "rank": 0},
                                                            {"step": 7, "rank": 1}]
    victim = next((directory / "step-000007").glob("*.rank-00001.bin"))
    data = bytearray(victim.read_bytes())
    data[8] ^= 0x01
    victim.write_bytes(data)
    with pytest.raises(CorruptCheckpoint, match="block 0 fails its checksum"):
        load(directory, {"w": [(50, 10)]})
