"""Staging buffers: a CPU save's buffer is a file in the memory tier's folder that becomes the
memory tier's data file by a hard link (no copy), is written again only once retention has
dropped that checkpoint, and is deleted when its process is gone; what a save writes this
way round-trips with resharding, and a damaged file is found."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest
import torch

from engine.checkpoint import (
    Checkpointer,
    CorruptCheckpoint,
    inspect,
    list_checkpoints,
    load_into,
    open_checkpoint,
)
from engine.checkpoint.staging import Staging

torch.set_num_threads(1)
N = 3 * (1 << 20) + 5  # elements: a few 4 MiB blocks, not a whole number of them


def values(step: int, n: int = N) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + step * 1e6


def staging_files(memory: Path) -> list[Path]:
    return sorted(memory.glob(".staging-*"))


def memory_data_file(memory: Path, step: int) -> Path:
    (file,) = (memory / f"step-{step:06d}").glob("*.safetensors")
    return file


def test_the_memory_tier_file_is_the_staging_buffer_linked_not_copied(tmp_path):
    memory = tmp_path / "memory"
    ckpt = Checkpointer(tmp_path / "disk", memory_dir=memory)
    ckpt.save(1, {"w": (values(1), 0, N)})
    ckpt.wait()
    data = memory_data_file(memory, 1)
    linked = [f for f in staging_files(memory) if f.stat().st_ino == data.stat().st_ino]
    assert len(linked) == 1 and data.stat().st_nlink == 2
    disk_data = next((tmp_path / "disk" / "step-000001").glob("*.safetensors"))
    assert disk_data.read_bytes() == data.read_bytes()  # the disk tier was written from it
    ckpt.close()
    assert staging_files(memory) == [] and data.stat().st_nlink == 1  # the checkpoint stays
    target = torch.empty(N)
    load_into(memory / "step-000001", {"w": (target, 0, N)})
    assert torch.equal(target, values(1))


def test_a_reserved_buffer_is_made_before_the_first_save_and_taken_by_it(tmp_path):
    """The first save copies into memory made beforehand, not memory it makes while the
    step waits: its memory-tier file is the buffer `reserve` made."""
    memory = tmp_path / "memory"
    ckpt = Checkpointer(tmp_path / "disk", memory_dir=memory)
    ckpt.reserve(N * 4, pinned=False)
    for _ in range(600):  # its own thread makes it
        if staging_files(memory):
            break
        time.sleep(0.05)
    (reserved,) = staging_files(memory)
    ckpt.save(1, {"w": (values(1), 0, N)})
    ckpt.wait()
    assert memory_data_file(memory, 1).stat().st_ino == reserved.stat().st_ino
    ckpt.close()
    target = torch.empty(N)
    load_into(memory / "step-000001", {"w": (target, 0, N)})
    assert torch.equal(target, values(1))


def test_a_reservation_after_close_leaves_no_buffer(tmp_path):
    memory = tmp_path / "memory"
    ckpt = Checkpointer(tmp_path / "disk", memory_dir=memory)
    ckpt.close()
    ckpt._stage(N * 4, pinned=False)  # what a reservation thread finishing late does
    assert staging_files(memory) == []


@pytest.mark.parametrize("memory_keep", [1, 2])
def test_a_buffer_is_written_again_only_after_retention_drops_its_checkpoint(tmp_path,
                                                                             memory_keep):
    memory = tmp_path / "memory"
    ckpt = Checkpointer(tmp_path / "disk", memory_dir=memory, memory_keep=memory_keep)
    inodes = []
    for step in range(1, 6):
        if step > 1:  # the persist thread made the buffer ready before the save asks for it
            assert any(b.reusable and b.capacity >= N * 4 for b in ckpt._free)
        ckpt.save(step, {"w": (values(step), 0, N)}, to_disk=False)
        ckpt.wait()
        inodes.append(memory_data_file(memory, step).stat().st_ino)
        target = torch.empty(N)  # the previous checkpoint was intact until this one committed
        load_into(memory / f"step-{step:06d}", {"w": (target, 0, N)})
        assert torch.equal(target, values(step))
        assert len(staging_files(memory)) <= memory_keep + 1
    assert [info.step for info in list_checkpoints(memory)] == list(range(6 - memory_keep, 6))
    # the buffers take turns: no fresh memory once each kept checkpoint has one, and one more
    assert len(set(inodes)) == memory_keep + 1
    ckpt.close()


def test_a_checkpointer_without_memory_tier_stages_in_anonymous_memory(tmp_path):
    assert not Staging(1 << 20, pinned=False, folder=None).file_backed
    ckpt = Checkpointer(tmp_path / "disk", memory_dir=None)
    ckpt.save(1, {"w": (values(1), 0, N)})
    ckpt.close()
    target = torch.empty(N)
    load_into(tmp_path / "disk", {"w": (target, 0, N)})
    assert torch.equal(target, values(1))


def test_a_dead_processs_staging_file_is_deleted_and_a_living_ones_kept(tmp_path):
    dead, alive = tmp_path / ".staging-dead", tmp_path / ".staging-alive"
    dead.write_bytes(b"x" * 4096)
    alive.write_bytes(b"y" * 4096)
    holder = os.open(alive, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # as a living checkpointer holds its own
    try:
        staging = Staging(1 << 20, pinned=False, folder=tmp_path)
        assert staging.file_backed
        assert not dead.exists() and alive.exists() and staging.name.exists()
        staging.close()
        assert not staging.name.exists()
    finally:
        os.close(holder)


@pytest.mark.parametrize("tier", ["memory", "disk"])
def test_a_world_of_3_saved_through_linked_buffers_loads_into_a_world_of_2(tmp_path, tier):
    memory = tmp_path / "memory"
    full = {"a": values(7), "b": values(8, 1000).to(torch.float64)}
    writers = [Checkpointer(tmp_path / "disk", rank=r, world_size=3, run_id="reshard",
                            memory_dir=memory) for r in range(3)]
    for rank, ckpt in enumerate(writers):
        shards = {}
        for name, t in full.items():
            start, stop = t.numel() * rank // 3, t.numel() * (rank + 1) // 3
            shards[name] = (t[start:stop], start, t.numel())
        ckpt.save(4, shards)
    for ckpt in writers:
        ckpt.close()
    for rank in range(2):
        targets = {}
        for name, t in full.items():
            start, stop = t.numel() * rank // 2, t.numel() * (rank + 1) // 2
            targets[name] = (torch.empty(stop - start, dtype=t.dtype), start, t.numel())
        load_into(tmp_path / tier / "step-000004", targets)
        for name, (shard, start, _) in targets.items():
            assert torch.equal(shard, full[name][start : start + shard.numel()])


def test_a_corrupted_or_truncated_memory_tier_file_is_named_with_its_fault(tmp_path):
    memory = tmp_path / "memory"
    ckpt = Checkpointer(tmp_path / "disk", memory_dir=memory)
    ckpt.save(1, {"w": (values(1), 0, N)}, to_disk=False)
    ckpt.close()
    data = memory_data_file(memory, 1)
    with open(data, "r+b") as f:
        f.seek(5 << 20)
        byte = f.read(1)
        f.seek(5 << 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptCheckpoint, match=rf"{data.name} block 1 fails its checksum"):
        load_into(memory / "step-000001", {"w": (torch.empty(N), 0, N)})
    os.truncate(data, data.stat().st_size - 1)
    info = inspect(memory / "step-000001")
    assert not info.good and "truncated" in info.problem and data.name in info.problem
    with pytest.raises(CorruptCheckpoint, match="truncated"):
        open_checkpoint(memory / "step-000001")
