"""Data: the default corpus, user corpora, and a loader that resumes exactly."""

import json

import pytest
import torch

from engine.runtime.data import DataError, TokenLoader, load_tokens, stdlib_source_files
from engine.runtime.spec import DatasetSpec


def test_default_corpus_is_the_standard_library_source():
    files = stdlib_source_files()
    assert any(f.name == "os.py" for f in files)
    splits = load_tokens(DatasetSpec())
    assert splits.vocab_size == 256
    assert len(splits.train) > 1_000_000
    assert 0 < len(splits.heldout) < len(splits.train) // 20
    assert int(splits.train.max()) < 256


def test_text_and_jsonl_corpora(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n" * 50)
    (tmp_path / "b.txt").write_text("second file\n" * 50)
    text = load_tokens(DatasetSpec(kind="text", paths=[str(tmp_path / "*.txt")], holdout=0.1))
    assert bytes(text.train[:11].tolist()) == b"hello world"
    assert len(text.train) + len(text.heldout) == 1200

    with (tmp_path / "c.jsonl").open("w") as f:
        for i in range(20):
            f.write(json.dumps({"body": f"record {i}", "other": 1}) + "\n")
    jsonl = load_tokens(
        DatasetSpec(kind="jsonl", paths=[str(tmp_path / "c.jsonl")], field="body", holdout=0.1)
    )
    assert bytes(jsonl.train[:6].tolist()) == b"record"


def test_bad_user_data_names_the_field(tmp_path):
    with pytest.raises(DataError, match=r"train\.dataset\.paths\.0"):
        load_tokens(DatasetSpec(kind="text", paths=[str(tmp_path / "none*.txt")]))
    (tmp_path / "d.jsonl").write_text('{"text": 1}\n')
    with pytest.raises(DataError, match=r"train\.dataset\.field"):
        load_tokens(DatasetSpec(kind="jsonl", paths=[str(tmp_path / "d.jsonl")]))


def test_hugging_face_tokenizer_from_a_local_file(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(corpus)], trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))

    splits = load_tokens(DatasetSpec(kind="text", paths=[str(corpus)],
                                     tokenizer=str(tmp_path / "tokenizer.json"), holdout=0.1))
    assert splits.vocab_size == tok.get_vocab_size()
    assert splits.train.tolist()[:3] == tok.encode("the quick brown").ids


def tokens(n=10_000):
    return torch.arange(n) % 251


def test_resuming_from_a_saved_position_gives_the_same_batches():
    straight = TokenLoader(tokens(), seq_len=16, micro_batch=4, rank=0, world_size=1, seed=7)
    expected = [straight.next_batch() for _ in range(400)]  # crosses epochs (624 windows)

    first = TokenLoader(tokens(), seq_len=16, micro_batch=4, rank=0, world_size=1, seed=7)
    for _ in range(150):
        first.next_batch()
    resumed = TokenLoader(tokens(), seq_len=16, micro_batch=4, rank=0, world_size=1, seed=7)
    resumed.load_state_dict(first.state_dict())
    for want in expected[150:]:
        got = resumed.next_batch()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_ranks_split_the_same_global_batch():
    whole = TokenLoader(tokens(), seq_len=16, micro_batch=4, rank=0, world_size=1, seed=3)
    halves = [TokenLoader(tokens(), seq_len=16, micro_batch=2, rank=r, world_size=2, seed=3)
              for r in range(2)]
    for _ in range(10):
        inputs, labels = whole.next_batch()
        parts = [h.next_batch() for h in halves]
        assert torch.equal(inputs, torch.cat([p[0] for p in parts]))
        assert torch.equal(labels[:, :-1], inputs[:, 1:])


def test_skipping_a_window_moves_past_it():
    a = TokenLoader(tokens(), seq_len=16, micro_batch=4, rank=0, world_size=1, seed=1)
    b = TokenLoader(tokens(), seq_len=16, micro_batch=4, rank=0, world_size=1, seed=1)
    for _ in range(3):
        a.next_batch()
    b.skip(3)
    assert torch.equal(a.next_batch()[0], b.next_batch()[0])
