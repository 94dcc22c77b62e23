"""Tokenizers a dataset is prepared with: bytes, a tokenizer.json, a Hugging Face folder; each
with its hash, vocabulary and end-of-document token, nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.data.tokenizers import load_tokenizer, token_dtype
from engine.errors import DataError


def bpe_tokenizer(folder: Path, vocab_size: int = 120, eos: str | None = "<|endoftext|>") -> Path:
    """A small BPE tokenizer trained here on ordinary text (nothing can be downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    corpus = folder / "bpe-corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["[UNK]", eos] if eos else ["[UNK]"]
    tok.train([str(corpus)], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials))
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def wide_tokenizer(folder: Path, vocab_size: int = 70_000) -> Path:
    """A word-level tokenizer whose vocabulary does not fit 16 bits."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|endoftext|>": 1} | {f"w{i}": i + 2 for i in range(vocab_size - 2)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def test_bytes_are_their_own_tokens_with_nul_ending_a_document():
    tok = load_tokenizer("bytes")
    assert (tok.vocab_size, tok.eod, token_dtype(tok.vocab_size).name) == (256, 0, "uint16")
    assert tok.encode_batch(["hé"])[0].tolist() == list("hé".encode())


def test_a_tokenizer_file_ends_documents_with_its_end_of_text_token(tmp_path):
    path = bpe_tokenizer(tmp_path)
    tok = load_tokenizer(str(path))
    assert tok.eod == tok._tok.token_to_id("<|endoftext|>") and tok.eod < tok.vocab_size
    assert tok.encode_batch(["the lazy dog"])[0].tolist() == tok.encode("the lazy dog")
    assert tok.sha256 != load_tokenizer(str(bpe_tokenizer(tmp_path, vocab_size=40))).sha256


def test_a_tokenizer_without_an_end_token_gets_one_past_its_vocabulary(tmp_path):
    tok = load_tokenizer(str(bpe_tokenizer(tmp_path, eos=None)))
    size = tok._tok.get_vocab_size()
    assert (tok.eod, tok.vocab_size) == (size, size + 1)


def test_a_hugging_face_folder_reads_its_eos_token_from_the_config(tmp_path):
    bpe_tokenizer(tmp_path, eos="</s>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    tok = load_tokenizer(str(tmp_path))
    assert tok.eod == tok._tok.token_to_id("</s>")


def test_a_wide_vocabulary_is_stored_in_32_bits(tmp_path):
    tok = load_tokenizer(str(wide_tokenizer(tmp_path)))
    assert (tok.vocab_size, tok.eod, token_dtype(tok.vocab_size).name) == (70_000, 1, "uint32")
    assert tok.encode_batch(["w69997 w5"])[0].tolist() == [69_999, 7]


def test_a_missing_tokenizer_names_the_field(tmp_path):
    with pytest.raises(DataError, match=r"train\.dataset\.tokenizer: no tokenizer file"):
        load_tokenizer(str(tmp_path / "nope.json"))
