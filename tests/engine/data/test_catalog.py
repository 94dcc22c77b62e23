"""The job's sources: the prepared datasets `train.data.mix` names (under the data roots), or
`train.dataset` prepared on first use (engine.data.cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.data.cache import CACHE_ENV
from engine.data.catalog import open_sources
from engine.data.prepare import prepare
from engine.data.sources import SourceSpec
from engine.errors import DataError
from engine.runtime.confine import OUTSIDE
from engine.runtime.spec import parse_spec
from tests.engine.data.test_prepare import corpus


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_mixture_opens_each_prepared_folder_with_its_weight_and_name(tmp_path):
    for name in ("web", "code"):
        corpus(tmp_path / "src" / name, documents=3)
        prepare([SourceSpec("text", [str(tmp_path / "src" / name / "*.txt")])], "bytes",
                str(tmp_path / "data" / name), workers=1)
    spec = parse_spec({"name": "t", "data": {"roots": [str(tmp_path / "data")]},
                       "train": {"data": {"mix": [
                           {"path": str(tmp_path / "data" / "web"), "weight": 0.7},
                           {"path": str(tmp_path / "data" / "code"), "weight": 0.3,
                            "name": "python"}]}}})
    sources = open_sources(spec)
    assert [(s.name, s.weight, s.vocab_size, s.eod) for s in sources] == [
        ("web", 0.7, 256, 0), ("python", 0.3, 256, 0)]
    assert len(sources[0].train) > 0 and len(sources[1].heldout) > 0


def test_a_mixture_entry_outside_the_roots_is_refused_even_through_a_link(tmp_path):
    corpus(tmp_path / "src", documents=2)
    prepare([SourceSpec("text", [str(tmp_path / "src" / "*.txt")])], "bytes",
            str(tmp_path / "theirs"), workers=1)
    root = tmp_path / "root"
    root.mkdir()
    (root / "mine").symlink_to(tmp_path / "theirs")
    for path in (tmp_path / "theirs", root / "mine", root / ".." / "theirs"):
        spec = parse_spec({"name": "t", "data": {"roots": [str(root)]},
                           "train": {"data": {"mix": [{"path": str(path)}]}}})
        with pytest.raises(DataError) as refused:
            open_sources(spec)
        assert str(refused.value) == f"train.data.mix.0.path: {OUTSIDE}"


def test_without_a_mixture_the_raw_dataset_is_the_one_source(tmp_path, cache):
    corpus(tmp_path / "src", documents=5)
    [source] = open_sources(parse_spec({"name": "t", "train": {"dataset": {
        "kind": "text", "paths": [str(tmp_path / "src" / "*.txt")], "holdout": 0.2}}}))
    assert source.name == "dataset" and source.train.read(0, 5).tolist() == list(b"w0 w1")
    assert (source.vocab_size, source.eod) == (256, 0) and len(source.heldout) > 0
