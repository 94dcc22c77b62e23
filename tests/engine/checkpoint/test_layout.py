"""Atomicity and integrity: only a complete, intact checkpoint exists; a partial or corrupt
one is passed over for the previous good one, and the loader says which and why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from engine.checkpoint import (
    Checkpointer,
    find_latest_good,
    inspect,
    list_checkpoints,
    load,
    restore,
)
from tests.engine.ranks import run_ranks

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[3]


def save_two_ranks(directory: Path, steps: list[int], run_id: str = "run") -> None:
    ranks = [Checkpointer(directory, rank=r, world_size=2, run_id=run_id, memory_dir=None, keep=5)
             for r in range(2)]
    for step in steps:
        for r, ckpt in enumerate(ranks):
            ckpt.save(step, {"w": (torch.full((50,), float(step)), 50 * r, 100)}, {"step": step})
    for ckpt in ranks:
        ckpt.close()


def data_file(directory: Path, step: int, rank: int) -> Path:
    return next((directory / f"step-{step:06d}").glob(f"*.rank-{rank:05d}.safetensors"))


def test_listing_describes_each_checkpoint(tmp_path):
    ckpt = Checkpointer(tmp_path, memory_dir=None, meta={"strategy": "GGG", "nodes": 1})
    ckpt.save(4, {"w": (torch.zeros(256), 0, 256)})
    ckpt.close()
    (info,) = list_checkpoints(tmp_path)
    size = data_file(tmp_path, 4, 0).stat().st_size  # the file's bytes, header included
    assert info.describe() == {
        "step": 4, "path": str(tmp_path / "step-000004"), "size": size,
        "good": True, "problem": "", "pinned": False, "strategy": "GGG", "world_size": 1,
        "meta": {"strategy": "GGG", "nodes": 1},
    }


def test_a_save_missing_a_rank_never_becomes_visible(tmp_path):
    save_two_ranks(tmp_path, [10])
    lone = Checkpointer(tmp_path, rank=0, world_size=2, run_id="crashed", memory_dir=None)
    lone.save(20, {"w": (torch.zeros(50), 0, 100)})  # rank 1 died before saving
    lone.close()
    latest, skipped = find_latest_good(tmp_path)
    assert latest.step == 10
    assert [(s.step, s.problem) for s in skipped] == [
        (20, "no manifest (incomplete: the save did not finish)")
    ]


CRASH_DURING_PERSIST = """
import os, sys, torch
from engine.checkpoint import Checkpointer
ckpt = Checkpointer(sys.argv[1], memory_dir=None, run_id="dies")
ckpt.save(20, {"w": (torch.full((8_000_000,), 20.0), 0, 8_000_000)})
os._exit(0)  # the process dies while its thread is writing
"""


def test_a_process_killed_while_persisting_leaves_the_previous_checkpoint(tmp_path):
    first = Checkpointer(tmp_path, memory_dir=None)
    first.save(10, {"w": (torch.full((8_000_000,), 10.0), 0, 8_000_000)})
    first.close()
    subprocess.run([sys.executable, "-c", CRASH_DURING_PERSIST, str(tmp_path)], cwd=REPO,
                   check=True, timeout=120)
    latest, skipped = find_latest_good(tmp_path)
    # atomic either way: the killed save is invisible, or (if it won the race) complete
    assert latest.step in (10, 20)
    assert load(latest, {"w": [(0, 8_000_000)]})["w"][0].eq(float(latest.step)).all()
    assert all("no manifest" in s.problem for s in skipped)


def test_a_truncated_file_is_skipped_and_reported(tmp_path):
    save_two_ranks(tmp_path, [10, 20])
    victim = data_file(tmp_path, 20, 1)
    victim.write_bytes(victim.read_bytes()[:-1])
    target = torch.empty(100)
    restored = restore([tmp_path], {"w": (target, 0, 100)})
    assert restored.step == 10 and target.eq(10).all()
    assert [s.step for s in restored.skipped] == [20]
    assert "truncated" in restored.skipped[0].problem
    assert victim.name in restored.skipped[0].problem


def test_a_flipped_byte_is_found_when_read_and_the_previous_one_is_loaded(tmp_path):
    save_two_ranks(tmp_path, [10, 20])
    victim = data_file(tmp_path, 20, 0)
    data = bytearray(victim.read_bytes())
    data[17] ^= 0x01
    victim.write_bytes(data)
    assert inspect(tmp_path / "step-000020").good  # same size: the quick check cannot tell
    assert "fails its checksum" in inspect(tmp_path / "step-000020", verify=True).problem
    target = torch.empty(100)
    restored = restore([tmp_path], {"w": (target, 0, 100)})
    assert restored.step == 10 and target.eq(10).all()
    assert restored.extras(1) == {"step": 10}
    (skipped,) = restored.skipped
    assert skipped.step == 20 and "block 0 fails its checksum" in skipped.problem


def test_a_lost_manifest_or_file_is_reported(tmp_path):
    save_two_ranks(tmp_path, [10, 20, 30, 40])
    (tmp_path / "step-000040" / "MANIFEST.json").write_text("{not json")
    (tmp_path / "step-000030" / "MANIFEST.json").write_text('{"format": 1, "step": 30}')
    data_file(tmp_path, 20, 0).unlink()
    latest, skipped = find_latest_good(tmp_path)
    assert latest.step == 10
    assert [s.step for s in skipped] == [40, 30, 20]
    assert "unreadable manifest: JSONDecodeError" in skipped[0].problem
    assert "unreadable manifest: KeyError('world_size')" in skipped[1].problem
    assert "missing file" in skipped[2].problem


def test_the_memory_tier_wins_at_equal_steps_and_nothing_found_is_none(tmp_path):
    ckpt = Checkpointer(tmp_path / "disk", memory_dir=tmp_path / "mem")
    ckpt.save(10, {"w": (torch.ones(4), 0, 4)})
    ckpt.close()
    latest, _ = find_latest_good(tmp_path / "mem", tmp_path / "disk")
    assert latest.path == tmp_path / "mem" / "step-000010"
    nothing = restore([tmp_path / "nowhere"], {"w": (torch.empty(4), 0, 4)})
    assert nothing.checkpoint is None and nothing.skipped == []


def _restore_worker(directory: str) -> None:
    rank = dist.get_rank()
    target = torch.empty(50)
    restored = restore([directory], {"w": (target, 50 * rank, 100)})
    assert restored.step == 10 and target.eq(10).all()
    (skipped,) = restored.skipped
    # rank 0 read only intact bytes of step 20; it still moves on with rank 1
    expected = "another rank found it corrupt" if rank == 0 else "fails its checksum"
    assert expected in skipped.problem, skipped.problem


def test_ranks_move_on_together_when_only_one_finds_corruption(tmp_path):
    save_two_ranks(tmp_path, [10, 20])
    victim = data_file(tmp_path, 20, 1)
    data = bytearray(victim.read_bytes())
    data[3] ^= 0x80
    victim.write_bytes(data)
    run_ranks(_restore_worker, str(tmp_path), procs_per_node=2, timeout_s=60)
