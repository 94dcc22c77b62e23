"""Reading a prepared dataset: its splits as token spans over memory-mapped shards (or ranged
reads from an object store), documents found by the index; a missing, truncated or damaged
shard is a DataError, never silent garbage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.data.prepare import MANIFEST, prepare
from engine.data.shards import PreparedDataset
from engine.data.sources import SourceSpec
from engine.errors import DataError
from tests.engine.data.test_prepare import corpus


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, list[str]]:
    """Twelve documents over several shards; every 4th from the second held out."""
    folder = tmp_path_factory.mktemp("prepared")
    texts = corpus(folder / "src", documents=12)
    prepare([SourceSpec("text", [str(folder / "src" / "*.txt")])], "bytes", str(folder / "out"),
            holdout=0.25, workers=1, shard_bytes=600)
    return folder / "out", texts


def stream(texts: list[str]) -> torch.Tensor:
    return torch.tensor(list(b"".join(t.encode() + b"\0" for t in texts)))


def test_a_split_reads_as_one_stream_across_its_shards(prepared):
    out, texts = prepared
    dataset = PreparedDataset.open(str(out))
    train, held = dataset.split("train"), dataset.split("heldout")
    assert len(train.shards) > 2 and (dataset.vocab_size, dataset.eod) == (256, 0)
    expected = stream([t for i, t in enumerate(texts) if i % 4 != 1])
    assert len(train) == len(expected)
    assert torch.equal(train.read(0, len(train)), expected)
    for start, stop in ((0, 1), (250, 900), (len(train) - 3, len(train) + 5)):
        assert torch.equal(train.read(start, stop), expected[start:stop])
    assert torch.equal(train[10:20], expected[10:20]) and train.read(5, 9).dtype == torch.long
    assert torch.equal(held.read(0, len(held)), stream(texts[1::4]))
    source = dataset.source("web", 0.3)
    assert (source.name, source.weight, source.train) == ("web", 0.3, train)
    assert dataset.source().name == "out"


def test_documents_are_found_by_the_index(prepared):
    out, texts = prepared
    train = PreparedDataset.open(str(out)).split("train")
    lengths = [len(t) + 1 for i, t in enumerate(texts) if i % 4 != 1]
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).tolist()
    assert train.doc_starts(0, len(train)).tolist() == starts
    assert train.doc_starts(starts[2], starts[4]).tolist() == starts[2:4]
    assert train.doc_starts(starts[2] + 1, starts[3]).tolist() == []


def copy_of(out: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(out, tmp_path / "copy"))


def test_a_truncated_or_missing_shard_is_refused_when_opened(prepared, tmp_path):
    copy = copy_of(prepared[0], tmp_path)
    shard = copy / "train" / "shard-00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(DataError, match=r"copy: train/shard-00001: shard-00001\.bin holds \d+ "
                                        r"bytes where its manifest says \d+: .*truncated"):
        PreparedDataset.open(str(copy))
    shard.unlink()
    with pytest.raises(DataError, match=r"shard-00001\.bin is missing"):
        PreparedDataset.open(str(copy))
    (copy / MANIFEST).unlink()
    with pytest.raises(DataError, match=r"train\.data\.mix: .* holds no prepared dataset"):
        PreparedDataset.open(str(copy))


def test_a_damaged_shard_is_found_by_its_checksum(prepared, tmp_path):
    copy = copy_of(prepared[0], tmp_path)
    PreparedDataset.open(str(copy), verify=True)
    shard = copy / "heldout" / "shard-00000.bin"
    data = bytearray(shard.read_bytes())
    data[3] ^= 1
    shard.write_bytes(bytes(data))
    PreparedDataset.open(str(copy))  # sizes only: what a start-up pays for
    with pytest.raises(DataError, match=r"heldout/shard-00000: shard-00000\.bin does not "
                                        r"match its checksum"):
        PreparedDataset.open(str(copy), verify=True)


def test_a_dataset_prepared_to_and_streamed_from_an_object_store(prepared, bucket, tmp_path):
    _, texts = prepared
    url = f"{bucket}/datasets/small"
    manifest = prepare([SourceSpec("text", [str(prepared[0].parent / "src" / "*.txt")])],
                       "bytes", url, holdout=0.25, workers=1, shard_bytes=600)
    local = PreparedDataset.open(str(prepared[0]))
    remote = PreparedDataset.open(url, verify=True)
    assert remote.manifest == manifest and remote.name == "small"
    for split in ("train", "heldout"):
        a, b = local.split(split), remote.split(split)
        assert len(a) == len(b)
        b.prefetch(0, len(b))  # what a loader asks for its next windows
        assert torch.equal(a.read(0, len(a)), b.read(0, len(b)))
        assert torch.equal(a.read(123, 1500), b.read(123, 1500))
        assert torch.equal(a.doc_starts(0, len(a)), b.doc_starts(0, len(b)))
