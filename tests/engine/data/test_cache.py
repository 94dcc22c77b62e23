"""The raw dataset (`train.dataset`) prepared on first use into a cache keyed by its sources and
tokenizer: once, by whichever process comes first, the others waiting for it; its files read
only under the data roots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.data.cache import CACHE_ENV, prepared
from engine.data.prepare import MANIFEST
from engine.errors import DataError
from engine.runtime.confine import OUTSIDE
from engine.runtime.spec import DatasetSpec
from tests.engine.data.test_prepare import REPO, corpus


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_raw_dataset_is_prepared_once_and_cached(tmp_path, cache):
    corpus(tmp_path / "src", documents=5)
    dataset = DatasetSpec(kind="text", paths=[str(tmp_path / "src" / "*.txt")], holdout=0.2)
    folder = prepared(dataset)
    assert folder.parent == cache and (folder / MANIFEST).exists()
    stamp = (folder / MANIFEST).stat().st_mtime_ns
    assert prepared(dataset) == folder and (folder / MANIFEST).stat().st_mtime_ns == stamp
    (tmp_path / "src" / "doc-000.txt").write_text("changed")  # new sources: a new dataset
    assert prepared(dataset) != folder


RANK = """
import sys
from engine.data.cache import prepared
from engine.runtime.spec import DatasetSpec
print(prepared(DatasetSpec(kind="text", paths=[sys.argv[1]])))
"""


def test_ranks_starting_together_prepare_it_once(tmp_path, cache):
    corpus(tmp_path / "src", documents=20, words=400)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path / "src" / "*.txt")],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    folders = {rank.communicate(timeout=120)[0].strip() for rank in ranks}
    assert len(folders) == 1 and all(rank.returncode == 0 for rank in ranks)
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [
        Path(folders.pop()).name]


def test_a_dataset_file_in_the_roots_is_read_and_one_outside_is_not(tmp_path, cache):
    root = tmp_path / "root"
    corpus(root, documents=2)
    prepared(DatasetSpec(kind="text", paths=[str(root / "*.txt")]), [str(root)])
    with pytest.raises(DataError, match=rf"train\.dataset\.paths\.0: {OUTSIDE}"):
        prepared(DatasetSpec(kind="text", paths=[str(tmp_path / "*" / "*.txt")]), [str(root)])
