"""Checkpoints in an S3-compatible object store (moto's server, real HTTP, through s3fs): the
same layout, commit, listing, retention and ranged resharding loads as on a local folder,
without a rename: a step folder whose manifest is not there is no checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fsspec
import torch

from engine.checkpoint import (
    Checkpointer,
    find_latest_good,
    inspect,
    list_checkpoints,
    load,
    open_checkpoint,
    pin,
    present,
    restore,
    unpin,
)
from engine.checkpoint.layout import BLOCK_BYTES, MANIFEST
from engine.checkpoint.store import Url, children, location, sizes
from engine.contract import checkpoint_dir, checkpoint_tiers, memory_dir
from tests.engine.runtime.test_control import Run, losses_by_step, nano

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[3]


def good_steps(directory: str) -> list[int]:
    return [info.step for info in list_checkpoints(directory) if info.good]


def save_ranks(directory: str, steps: list[int], ranks: list[int], world: int = 2) -> None:
    """Each of `ranks` saves its half of "w" (100 elements) at every step."""
    savers = [Checkpointer(directory, rank=r, world_size=world, run_id="run", memory_dir=None,
                           keep=5) for r in ranks]
    for step in steps:
        for r, ckpt in zip(ranks, savers, strict=True):
            ckpt.save(step, {"w": (torch.full((50,), float(step)), 50 * r, 100)}, {"step": step})
    for ckpt in savers:
        ckpt.close()


def test_a_url_is_a_location_also_after_pathlib_folded_its_slashes(tmp_path):
    assert location("s3://b/run") == Url("s3://b/run") == location(Path("s3://b/run"))
    assert location("s3://b/run") / "step-000001" == Url("s3://b/run/step-000001")
    assert location(Url("s3://b/run")).name == "run"
    assert location(tmp_path) == tmp_path and location(f"file://{tmp_path}") == tmp_path


def test_checkpoints_are_written_listed_kept_and_pinned_on_s3(bucket):
    directory = f"{bucket}/run"
    ckpt = Checkpointer(directory, memory_dir=None, keep=2)
    for step in (1, 2, 3, 4):
        ckpt.save(step, {"w": (torch.arange(10.0) * step, 0, 10)}, {"step": step})
    ckpt.wait()
    assert good_steps(directory) == [3, 4]
    pin(f"{directory}/step-000003")
    for step in (5, 6):
        ckpt.save(step, {"w": (torch.arange(10.0) * step, 0, 10)}, {"step": step})
    ckpt.close()
    listed = list_checkpoints(directory)
    assert [(i.step, i.pinned) for i in listed] == [(3, True), (5, False), (6, False)]
    assert str(listed[-1].path) == f"{directory}/step-000006"
    newest, skipped = find_latest_good(directory)
    assert newest.step == 6 and skipped == []
    assert torch.equal(load(directory, {"w": [(2, 3)]})["w"][0], torch.tensor([12.0, 18, 24]))
    unpin(listed[0].path)
    assert not list_checkpoints(directory)[0].pinned
    assert present(f"{directory}/step-000006") and not present(f"{directory}/step-000002")


def test_a_save_without_its_manifest_is_no_checkpoint_on_s3(bucket):
    directory = f"{bucket}/run"
    save_ranks(directory, [5], ranks=[0, 1])
    save_ranks(directory, [10], ranks=[0])  # rank 1 never finishes: its parts are all there is
    half = list_checkpoints(directory)[-1]
    assert half.step == 10 and not half.good and "no manifest" in half.problem
    assert MANIFEST not in sizes(half.path)
    assert "run-000001.rank-00000.safetensors" in sizes(half.path)
    newest, skipped = find_latest_good(directory)
    assert newest.step == 5 and [s.step for s in skipped] == [10]
    target = torch.zeros(100)
    restored = restore([directory], {"w": (target, 0, 100)})
    assert restored.step == 5 and torch.equal(target, torch.full((100,), 5.0))
    assert restored.extras(1) == {"step": 5}


def test_resharding_on_load_fetches_only_the_blocks_that_hold_the_wanted_range(bucket, tmp_path):
    # two ranks of 6 MiB each: two blocks per file, 4 MiB then 2 MiB
    half = 3 * BLOCK_BYTES // 2 // 4
    for directory in (f"{bucket}/big", tmp_path):
        savers = [Checkpointer(directory, rank=r, world_size=2, run_id="big", memory_dir=None)
                  for r in range(2)]
        for r, ckpt in enumerate(savers):
            ckpt.save(1, {"w": (torch.arange(half * r, half * (r + 1), dtype=torch.float32),
                                half * r, 2 * half)})
        for ckpt in savers:
            ckpt.close()
    for directory in (f"{bucket}/big", tmp_path):
        with open_checkpoint(directory) as reader:
            # a new rank's range across the old ranks' boundary: rank 0's tail block (2 MiB and
            # the extras) and rank 1's first block, about half of the 12 MiB saved
            got = reader.read("w", half - 10, 20)
            assert torch.equal(got, torch.arange(half - 10, half + 10, dtype=torch.float32))
            tail = reader.parts[0]["nbytes"] - BLOCK_BYTES
            assert reader.bytes_read == tail + BLOCK_BYTES < reader.info.size * 0.6


def test_a_rollback_on_s3_deletes_later_checkpoints_and_sets_pinned_ones_aside(bucket):
    directory = f"{bucket}/run"
    ckpt = Checkpointer(directory, memory_dir=None, keep=5)
    for step in (1, 2, 3):
        ckpt.save(step, {"w": (torch.full((4,), float(step)), 0, 4)})
    ckpt.wait()
    pin(f"{directory}/step-000003")
    ckpt.forget_after(1)
    ckpt.close()
    assert good_steps(directory) == [1]
    [aside] = children(location(f"{directory}/abandoned"))  # out of the resume candidates
    assert aside.name.startswith("step-000003-")
    info = inspect(aside)
    assert info.good and info.pinned and info.step == 3


def test_the_endpoint_may_come_from_fsspecs_own_variable(bucket):
    directory = f"{bucket}/run"
    save_ranks(directory, [7], ranks=[0, 1])
    env = {**os.environ, "FSSPEC_S3_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"]}
    del env["AWS_ENDPOINT_URL"]
    listed = subprocess.run(
        [sys.executable, "-c", "import sys; from engine.checkpoint import list_checkpoints; "
         "print([i.step for i in list_checkpoints(sys.argv[1]) if i.good])", directory],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert listed.stdout.strip() == "[7]", listed.stderr[-2000:]


def test_the_memory_tier_of_a_url_is_a_local_folder_keyed_by_the_url():
    first, again, other = (memory_dir(u) for u in ("s3://b/run", "s3://b/run", "s3://b/other"))
    assert first == again != other and first.parent in (Path("/dev/shm"), Path("/tmp"))
    assert checkpoint_tiers("s3://b/run") == [first, "s3://b/run"]
    assert checkpoint_dir("s3://b/run", Path("runs/x")) == "s3://b/run"


def s3_spec(name: str, directory: str, procs: int, steps: int) -> dict:
    # one rank takes both ranks' micro batches: the global batch is kept across the reshard
    spec = nano(name, steps=steps, procs=procs, micro_batch=4 // procs, every=5)
    spec["checkpoint"].update(dir=directory, keep=10)
    return spec


def test_a_run_checkpoints_to_s3_rolls_back_and_is_resumed_resharded_from_it(bucket, tmp_path):
    first = Run(tmp_path, s3_spec("first", f"{bucket}/first", procs=2, steps=30))
    first.wait_for(lambda e: e["type"] == "step" and e["step"] >= 13)
    first.command("rollback", step=10)
    back = first.wait_for(lambda e: e["type"] == "action" and e["action"] == "rollback")
    assert first.finish() == 0
    assert back["checkpoint"] == f"{bucket}/first/step-000010"
    events = first.events()
    before = losses_by_step([e for e in events if e["seq"] < back["seq"]])
    after = losses_by_step([e for e in events if e["seq"] > back["seq"]])
    assert min(after) == 11 and max(after) == 30
    # the same data again from the state the object store gave back: the same losses, bitwise
    assert all(after[s] == before[s] for s in range(11, back["from_step"] + 1))
    assert good_steps(f"{bucket}/first") == [5, 10, 15, 20, 25, 30]
    assert not (first.run_dir / "checkpoints").exists()

    # from 2 ranks to 1, straight from the bucket
    second = Run(tmp_path, s3_spec("second", f"{bucket}/second", procs=1, steps=35),
                 "--resume", f"{bucket}/first")
    assert second.finish() == 0
    resumed = second.events()
    assert f"from {bucket}/first/step-000030" in next(
        e["message"] for e in resumed if e["type"] == "log" and "resumed" in e["message"])
    assert sorted(losses_by_step(resumed)) == [31, 32, 33, 34, 35]
    assert good_steps(f"{bucket}/second") == [35]
    # the same checkpoint copied to a local folder resumes to the same losses
    local = tmp_path / "copy" / "step-000030"
    fsspec.filesystem("s3").get(f"{bucket}/first/step-000030/", str(local), recursive=True)
    third = Run(tmp_path, s3_spec("third", str(tmp_path / "third-ckpt"), procs=1, steps=35),
                "--resume", str(local))
    assert third.finish() == 0
    assert losses_by_step(third.events()) == losses_by_step(resumed)
