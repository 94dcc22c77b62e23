"""Large durable writes: the bytes land whole whether the filesystem takes O_DIRECT (a disk)
or not (tmpfs before Linux 6.6), for any length and any buffer alignment."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.checkpoint.store import ALIGNMENT, write_buffer


def aligned_bytes(n: int) -> torch.Tensor:
    raw = torch.randint(0, 256, (n + ALIGNMENT,), dtype=torch.uint8)
    skip = -raw.data_ptr() % ALIGNMENT
    return raw[skip : skip + n]


@pytest.mark.parametrize("length", [3 * ALIGNMENT, 5 * ALIGNMENT + 17, 100])
@pytest.mark.parametrize("folder", ["tmp", "shm"])
def test_write_buffer_writes_every_byte_and_leaves_no_temporary(tmp_path, folder, length):
    where = tmp_path if folder == "tmp" else Path("/dev/shm") / tmp_path.name
    where.mkdir(exist_ok=True)
    try:
        data = aligned_bytes(length + 1)
        for view in (data[:length], data[1:]):  # aligned, then one byte off alignment
            write_buffer(where / "f.bin", memoryview(view.numpy()), "t")
            assert (where / "f.bin").read_bytes() == view.numpy().tobytes()
        assert [p.name for p in where.iterdir()] == ["f.bin"]
    finally:
        if folder == "shm":
            for p in where.iterdir():
                p.unlink()
            where.rmdir()
