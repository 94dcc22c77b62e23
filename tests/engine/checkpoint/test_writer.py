"""Flash saves: the caller blocks only for the copy, a thread persists, wait() flushes;
retention and pinning; the memory tier survives the process that wrote it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import torch

from engine.checkpoint import (
    Checkpointer,
    CheckpointError,
    list_checkpoints,
    load,
    open_checkpoint,
    pin,
    read_extras,
    store,
    unpin,
)
from engine.contract import memory_dir

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[3]


def state(value: float, n: int = 100) -> dict:
    return {"w": (torch.full((n,), value), 0, n)}


def steps_in(directory: Path) -> list[int]:
    return [info.step for info in list_checkpoints(directory) if info.good]


def test_persisting_runs_on_the_background_thread_and_wait_flushes(tmp_path, monkeypatch):
    release, writers = threading.Event(), []
    real_write = store.write

    def gated_write(path, chunks, tmp_tag):
        writers.append(threading.current_thread().name)
        release.wait(timeout=30)
        real_write(path, chunks, tmp_tag)

    monkeypatch.setattr(store, "write", gated_write)
    ckpt = Checkpointer(tmp_path, memory_dir=None)
    ckpt.save(1, state(1.0))  # returns although the writer is held
    assert ckpt.pending == 1 and steps_in(tmp_path) == []
    release.set()
    ckpt.wait()
    assert ckpt.pending == 0 and steps_in(tmp_path) == [1]
    assert set(writers) == {"checkpoint-persist-r0-disk"}  # the disk tier's writer
    ckpt.close()


def test_a_save_is_a_snapshot_the_caller_may_change_right_after(tmp_path):
    ckpt = Checkpointer(tmp_path, memory_dir=None)
    shard = torch.arange(10.0)
    extras = {"data_position": 7}
    ckpt.save(1, {"w": (shard, 0, 10)}, extras)
    shard.add_(100)
    extras["data_position"] = 8
    ckpt.close()
    assert torch.equal(load(tmp_path, {"w": [(0, 10)]})["w"][0], torch.arange(10.0))
    assert read_extras(tmp_path, 0) == {"data_position": 7}


class Part:
    def __init__(self, value: dict | None = None):
        self.value = value

    def state_dict(self) -> dict:
        return dict(self.value)

    def load_state_dict(self, state: dict) -> None:
        self.value = state


def test_stateful_parts_are_saved_by_name_and_given_back(tmp_path):
    saved = Checkpointer(tmp_path, memory_dir=None, parts={"train": Part({"step": 3})})
    saved.save(3, state(1.0))
    saved.close()
    assert read_extras(tmp_path, 0) == {"train": {"step": 3}}
    loaded = Checkpointer(tmp_path, memory_dir=None, parts={"train": Part()})
    with open_checkpoint(tmp_path) as reader:
        loaded.load_parts(reader)
    assert loaded.parts["train"].value == {"step": 3}


def test_a_checkpoint_from_before_named_parts_loads_into_the_one_part(tmp_path):
    old = Checkpointer(tmp_path, memory_dir=None)
    old.save(5, state(1.0), {"step": 5, "tokens": 640})  # the flat extras of older runs
    old.close()
    loaded = Checkpointer(tmp_path, memory_dir=None, parts={"train": Part()})
    with open_checkpoint(tmp_path) as reader:
        loaded.load_parts(reader)
    assert loaded.parts["train"].value == {"step": 5, "tokens": 640}


def test_retention_keeps_the_newest_and_the_pinned(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2, memory_dir=None)
    ckpt.save(1, state(1))
    ckpt.wait()
    pin(tmp_path / "step-000001")
    for step in (2, 3, 4):
        ckpt.save(step, state(step))
    ckpt.wait()
    assert steps_in(tmp_path) == [1, 3, 4]
    unpin(tmp_path / "step-000001")
    ckpt.save(5, state(5))
    ckpt.close()
    assert steps_in(tmp_path) == [4, 5]


def test_memory_saves_go_to_the_memory_tier_only(tmp_path):
    ckpt = Checkpointer(tmp_path / "disk", memory_dir=tmp_path / "mem", memory_keep=1)
    ckpt.save(1, state(1), to_disk=True)
    ckpt.save(2, state(2), to_disk=False)
    ckpt.wait()
    assert steps_in(tmp_path / "disk") == [1]
    assert steps_in(tmp_path / "mem") == [2]
    ckpt.close(drop_memory_tier=True)  # a completed job gives the RAM back
    assert not (tmp_path / "mem").exists() and steps_in(tmp_path / "disk") == [1]


def test_resaving_a_step_replaces_it_atomically(tmp_path):
    """After a rollback the run reaches the same step again with other values."""
    ckpt = Checkpointer(tmp_path, memory_dir=None)
    ckpt.save(5, state(1.0))
    ckpt.save(5, state(2.0), {"timeline": 2})
    ckpt.close()
    assert load(tmp_path, {"w": [(0, 100)]})["w"][0].eq(2.0).all()
    assert len(list((tmp_path / "step-000005").glob("*.safetensors"))) == 1


def test_committing_a_save_keeps_a_later_save_of_the_same_step_in_flight(tmp_path):
    # a scheduled save and a command's save at one step: the slower rank commits the first
    # while the faster one already writes the second into the same folder
    fast, slow = (Checkpointer(tmp_path, rank=r, world_size=2, run_id="twice", memory_dir=None)
                  for r in range(2))
    fast.save(5, {"w": (torch.zeros(2), 0, 4)})
    fast.save(5, {"w": (torch.ones(2), 0, 4)})
    fast.wait()
    slow.save(5, {"w": (torch.zeros(2), 2, 4)})
    slow.wait()  # commits the first save; the fast rank's second part must survive it
    slow.save(5, {"w": (torch.ones(2), 2, 4)})
    slow.wait()
    [info] = list_checkpoints(tmp_path)
    assert info.good and info.manifest["save_id"] == "twice-000002"
    files = sorted(f.name for f in info.path.iterdir())
    assert files == ["MANIFEST.json"] + [f"twice-000002.rank-0000{r}.{ext}"
                                         for r in (0, 1) for ext in ("json", "safetensors")]
    fast.close()
    slow.close()


def test_forget_after_drops_the_abandoned_timeline_in_both_tiers(tmp_path):
    ckpt = Checkpointer(tmp_path / "disk", memory_dir=tmp_path / "mem", keep=5, memory_keep=5)
    for step in (10, 20, 30, 40):
        ckpt.save(step, state(step))
    ckpt.wait()
    pin(tmp_path / "disk" / "step-000030")
    ckpt.forget_after(20)
    ckpt.close()
    assert steps_in(tmp_path / "disk") == steps_in(tmp_path / "mem") == [10, 20]
    # the pinned one is kept for its person, out of reach of resuming
    (kept,) = (tmp_path / "disk" / "abandoned").iterdir()
    assert kept.name.startswith("step-000030-") and (kept / "PINNED").exists()


def test_the_schedule_says_which_tier_is_due(tmp_path):
    ckpt = Checkpointer(tmp_path, every=10, memory_every=5, memory_dir=tmp_path / "mem")
    assert [ckpt.due(s) for s in (5, 10, 11)] == ["memory", "disk", None]
    ckpt.close()
    disk_only = Checkpointer(tmp_path, every=10, memory_every=5, memory_dir=None)
    assert [disk_only.due(s) for s in (5, 10)] == [None, "disk"]
    with pytest.raises(CheckpointError, match="to_disk=False needs a memory tier"):
        disk_only.save(5, state(1), to_disk=False)
    disk_only.close()
    assert str(memory_dir(tmp_path)).startswith("/dev/shm/ringside-ckpt-")
    assert memory_dir(tmp_path) == memory_dir(str(tmp_path) + "/")


def test_bad_input_is_named(tmp_path):
    ckpt = Checkpointer(tmp_path, memory_dir=None)
    with pytest.raises(TypeError, match=r"tensors\['w'\] must be \(shard, global_offset"):
        ckpt.save(1, {"w": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"tensors\['w'\]: shard of 3 elements at offset 2"):
        ckpt.save(1, {"w": (torch.zeros(3), 2, 4)})
    with pytest.raises(ValueError, match="step must be >= 0"):
        ckpt.save(-1, state(1))
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        Checkpointer(tmp_path, rank=2, world_size=2, run_id="x")
    with pytest.raises(ValueError, match="memory_every must be >= 0, got -1"):
        Checkpointer(tmp_path, memory_every=-1)
    with pytest.raises(ValueError, match="keep must be >= 1, got 0"):
        Checkpointer(tmp_path, keep=0)
    ckpt.close()


def test_a_failed_background_write_is_raised_by_wait(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    ckpt = Checkpointer(not_a_dir, memory_dir=None)
    ckpt.save(1, state(1))
    with pytest.raises(CheckpointError, match="background checkpoint write failed"):
        ckpt.wait()
    ckpt.close()  # the failure was reported once; closing is clean


def test_a_tensor_nobody_saved_whole_is_refused_at_commit(tmp_path):
    ranks = [Checkpointer(tmp_path, rank=r, world_size=2, run_id="gap", memory_dir=None)
             for r in range(2)]
    ranks[0].save(1, {"w": (torch.zeros(4), 0, 10)})
    ranks[1].save(1, {"w": (torch.zeros(4), 6, 10)})
    errors = []
    for ckpt in ranks:  # whichever rank finishes last finds the gap when committing
        try:
            ckpt.close()
        except CheckpointError as e:
            errors.append(str(e))
    assert errors and "'w': no rank saved elements [4, ...) of 10" in errors[0]
    assert steps_in(tmp_path) == []


LOAD_IN_A_NEW_PROCESS = """
import sys, torch
from engine.checkpoint import restore
target = torch.empty(100)
restored = restore([sys.argv[1]], {"w": (target, 0, 100)})
print(restored.step, target.sum().item(), restored.extras()["data_position"])
"""


def test_the_memory_tier_is_readable_by_a_new_process(tmp_path):
    memory_dir = Path("/dev/shm") / f"ringside-test-{uuid.uuid4().hex}"
    try:
        ckpt = Checkpointer(tmp_path, memory_dir=memory_dir)
        ckpt.save(7, state(3.0), {"data_position": 42}, to_disk=False)
        ckpt.close()
        out = subprocess.run([sys.executable, "-c", LOAD_IN_A_NEW_PROCESS, str(memory_dir)],
                             cwd=REPO, capture_output=True, text=True, check=True, timeout=120)
        assert out.stdout.split() == ["7", "300.0", "42"]
    finally:
        shutil.rmtree(memory_dir, ignore_errors=True)
