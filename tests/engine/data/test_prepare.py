"""Prepare: sources tokenised into token shards (uint16 or uint32) with a document index per
split and a manifest written last; whole documents held out, never none of them; a prepare
killed mid-way resumes from its last finished shard and ends with the same dataset."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from engine.data.prepare import MANIFEST, STATE, PrepareProgress, prepare
from engine.data.sources import SourceSpec
from tests.engine.data.test_tokenizers import bpe_tokenizer, wide_tokenizer

REPO = Path(__file__).resolve().parents[3]


def corpus(folder: Path, documents: int = 12, words: int = 50) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for i in range(documents):
        texts.append(" ".join(f"w{(i * 7 + j) % 97}" for j in range(words + i)))
        (folder / f"doc-{i:03d}.txt").write_text(texts[-1])
    return texts


def split_tokens(out: Path, split: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """A split's tokens and document starts, its shards read back to back."""
    tokens, starts = [], []
    offset = 0
    for shard in sorted((out / split).glob("shard-*.bin")):
        tokens.append(np.fromfile(shard, dtype))
        starts.append(np.fromfile(shard.with_suffix(".idx"), "<i8") + offset)
        offset += len(tokens[-1])
    return np.concatenate(tokens), np.concatenate(starts)


def test_bytes_round_trip_in_uint16_with_a_document_index(tmp_path):
    texts = corpus(tmp_path / "src", documents=4)
    seen: list[PrepareProgress] = []
    manifest = prepare([SourceSpec("text", [str(tmp_path / "src" / "*.txt")])], "bytes",
                       str(tmp_path / "out"), holdout=0.25, workers=1, progress=seen.append)
    assert manifest["dtype"] == "uint16" and manifest["tokenizer"]["eod"] == 0
    tokens, starts = split_tokens(tmp_path / "out", "train", "<u2")
    train_docs = [texts[0], texts[2], texts[3]]  # every 4th document from the second held out
    assert bytes(tokens.astype("u1")).replace(b"\0", b"") == "".join(train_docs).encode()
    assert starts.tolist() == [0, len(train_docs[0]) + 1, len(train_docs[0] + train_docs[1]) + 2]
    held, _ = split_tokens(tmp_path / "out", "heldout", "<u2")
    assert bytes(held[:-1].astype("u1")).decode() == texts[1] and held[-1] == 0
    assert manifest["splits"]["heldout"] | {"shards": None} == {
        "tokens": len(texts[1]) + 1, "documents": 1, "shards": None}
    assert [s["size"] for s in manifest["sources"]] == [len(t) for t in texts]
    assert seen[-1].documents == 4 and seen[-1].bytes_read == seen[-1].bytes_total
    assert seen[-1].tokens == sum(len(t) + 1 for t in texts)


def test_a_wide_vocabulary_round_trips_in_uint32(tmp_path):
    corpus(tmp_path / "src", documents=3)
    tokenizer = wide_tokenizer(tmp_path)
    manifest = prepare([SourceSpec("text", [str(tmp_path / "src" / "*.txt")])],
                       str(tokenizer), str(tmp_path / "out"), holdout=0, workers=1)
    assert manifest["dtype"] == "uint32" and manifest["tokenizer"]["vocab_size"] == 70_000
    tokens, starts = split_tokens(tmp_path / "out", "train", "<u4")
    assert tokens[:3].tolist() == [2, 3, 4]  # w0 w1 w2
    assert tokens[starts[1:] - 1].tolist() == [1, 1]  # each document ended by <|endoftext|>


def test_two_documents_hold_one_out_and_one_document_holds_out_its_tail(tmp_path):
    corpus(tmp_path / "two", documents=2)
    two = prepare([SourceSpec("text", [str(tmp_path / "two" / "*.txt")])], "bytes",
                  str(tmp_path / "out2"), holdout=0.01, workers=1)
    assert [two["splits"][s]["documents"] for s in ("train", "heldout")] == [1, 1]

    (tmp_path / "one.jsonl").write_text(json.dumps({"text": "abcdefghij" * 10}) + "\n")
    one = prepare([SourceSpec("jsonl", [str(tmp_path / "one.jsonl")])], "bytes",
                  str(tmp_path / "out1"), holdout=0.05, workers=1)
    assert {s: one["splits"][s]["tokens"] for s in ("train", "heldout")} == {
        "train": 95 + 1, "heldout": 5 + 1}
    held, _ = split_tokens(tmp_path / "out1", "heldout", "<u2")
    assert bytes(held[:-1].astype("u1")) == b"fghij"


def test_a_bpe_prepare_over_worker_processes_matches_the_tokenizer(tmp_path):
    from engine.data.tokenizers import load_tokenizer

    texts = corpus(tmp_path / "src", documents=6)
    tokenizer = str(bpe_tokenizer(tmp_path))
    prepare([SourceSpec("text", [str(tmp_path / "src" / "*.txt")])], tokenizer,
            str(tmp_path / "out"), holdout=0, workers=2, shard_bytes=700)
    tok = load_tokenizer(tokenizer)
    expected = np.concatenate([np.append(ids, tok.eod) for ids in tok.encode_batch(texts)])
    assert len(list((tmp_path / "out" / "train").glob("*.bin"))) > 1
    assert np.array_equal(split_tokens(tmp_path / "out", "train", "<u2")[0], expected)


KILLED_PREPARE = """
import os, signal, sys
from engine.data.prepare import prepare
from engine.data.sources import SourceSpec
def die(p):
    if p.shards_done == 2:
        os.kill(os.getpid(), signal.SIGKILL)
prepare([SourceSpec("text", [sys.argv[1]])], "bytes", sys.argv[2], holdout=0.2, workers=1,
        shard_bytes=500, progress=die)
"""


def test_a_killed_prepare_leaves_no_manifest_and_resumes_from_its_last_shard(tmp_path):
    corpus(tmp_path / "src", documents=12)
    source = [SourceSpec("text", [str(tmp_path / "src" / "*.txt")])]
    out = tmp_path / "out"
    killed = subprocess.run([sys.executable, "-c", KILLED_PREPARE, source[0].paths[0], str(out)],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert killed.returncode == -signal.SIGKILL
    assert not (out / MANIFEST).exists() and (out / STATE).exists()
    assert len(json.loads((out / STATE).read_text())["shards"]) == 2

    seen: list[PrepareProgress] = []
    resumed = prepare(source, "bytes", str(out), holdout=0.2, workers=1, shard_bytes=500,
                      progress=seen.append)
    assert seen[0].shards_done == 2 and seen[0].bytes_resumed > 0
    straight = prepare(source, "bytes", str(tmp_path / "straight"), holdout=0.2, workers=1,
                       shard_bytes=500)
    assert resumed["splits"] == straight["splits"] and (out / MANIFEST).exists()
    assert not (out / STATE).exists()
    assert prepare(source, "bytes", str(out), holdout=0.2, workers=1, shard_bytes=500,
                   progress=seen.append) == resumed  # whole: nothing done again
