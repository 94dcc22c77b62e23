"""One lookup over a run's tiers finds a checkpoint by step or by name, memory tier first."""

from pathlib import Path

import torch

from engine.checkpoint import Checkpointer
from engine.checkpoint.layout import MANIFEST
from engine.checkpoint.lookup import find


def tiers(tmp_path: Path) -> list[Path]:
    """Steps 5 and 10 in both tiers (a disk save goes through the memory tier), 8 in memory
    only and 12 in both but incomplete."""
    ckpt = Checkpointer(tmp_path / "disk", memory_dir=tmp_path / "memory", run_id="r",
                        keep=5, memory_keep=5)
    for step, to_disk in ((5, True), (8, False), (10, True), (12, True)):
        ckpt.save(step, {"w": (torch.full((4,), float(step)), 0, 4)}, to_disk=to_disk)
    ckpt.close()
    (tmp_path / "disk" / "step-000012" / MANIFEST).unlink()
    (tmp_path / "memory" / "step-000012" / MANIFEST).unlink()
    return ckpt.tiers


def test_by_step_the_newest_good_checkpoint_at_or_before_it(tmp_path):
    memory, disk = tiers(tmp_path)
    assert find([memory, disk], step=9).path == memory / "step-000008"
    assert find([memory, disk], step=10).step == 10
    assert find([memory, disk], step=99).step == 10  # 12 never finished


def test_at_equal_steps_the_first_tier_wins(tmp_path):
    memory, disk = tiers(tmp_path)
    assert find([memory, disk], step=5).path == memory / "step-000005"
    assert find([disk, memory], step=5).path == disk / "step-000005"
    assert find([disk, memory], step=9).path == memory / "step-000008"  # newer beats faster


def test_by_name_or_path(tmp_path):
    memory, disk = tiers(tmp_path)
    assert find([memory, disk], name="step-000008").path == memory / "step-000008"
    assert find([memory, disk], name="step-000010").path == memory / "step-000010"
    assert find([memory, disk], name=str(disk / "step-000010")).path == disk / "step-000010"


def test_nothing_matches(tmp_path):
    memory, disk = tiers(tmp_path)
    assert find([memory, disk], step=4) is None
    assert find([memory, disk], name="step-000012") is None  # not a good checkpoint
    assert find([memory, disk]) is None
    assert find([tmp_path / "absent"], step=10) is None
