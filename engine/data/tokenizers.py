"""Tokenizers a dataset is prepared with: bytes, a local tokenizer.json, or a Hugging Face
tokenizer folder (its tokenizer.json; nothing is downloaded).

Each has a `name` (as the user gave it), a `sha256` of what defines it (so a manifest says
exactly which tokenizer made its tokens), a `vocab_size` and an end-of-document token `eod`:
- bytes: the UTF-8 bytes themselves, vocabulary 256, `eod` 0 (the NUL byte, which text does
  not hold; the document index, not the token, is what marks documents for masking);
- a tokenizer.json: its end-of-text token if it has one (`<|endoftext|>`, `</s>`, ...; in a
  folder, `tokenizer_config.json`'s `eos_token` first), else one id past its vocabulary,
  which then grows by one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import numpy as np

from engine.errors import DataError, SpecError
from engine.runtime.confine import open_confined

BYTES = "bytes"
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")
FIELD = "train.dataset.tokenizer"


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest little-endian dtype that holds every token id."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


class ByteTokenizer:
    name = BYTES
    sha256 = hashlib.sha256(b"bytes").hexdigest()
    vocab_size = 256
    eod = 0

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer from its JSON text."""

    def __init__(self, name: str, text: str, eos_token: str | None = None):
        from tokenizers import Tokenizer

        self.name = name
        self.text = text
        self.sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
        self._tok = Tokenizer.from_str(text)
        size = self._tok.get_vocab_size(with_added_tokens=True)
        candidates = (eos_token, *EOD_CANDIDATES) if eos_token else EOD_CANDIDATES
        eod = next((i for t in candidates if (i := self._tok.token_to_id(t)) is not None), None)
        self.eod = size if eod is None else eod
        self.vocab_size = max(size, self.eod + 1)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.uint32)
                for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


Tokenizer = ByteTokenizer | HFTokenizer


def _read(path: str, roots: Sequence[str]) -> str:
    try:
        with open_confined(path, roots, FIELD) as f:
            return f.read().decode("utf-8", errors="replace")
    except SpecError as e:
        raise DataError(str(e)) from e
    except OSError as e:  # a path in the roots (or unconfined): the user's to know about
        raise DataError(f"{FIELD}: no tokenizer file at {path!r}") from e


def _eos_token(folder: str, roots: Sequence[str]) -> str | None:
    """`eos_token` from a Hugging Face folder's tokenizer_config.json, if it names one."""
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(path):
        return None
    try:
        eos = json.loads(_read(path, roots)).get("eos_token")
    except (ValueError, AttributeError):
        return None
    return eos.get("content") if isinstance(eos, dict) else eos if isinstance(eos, str) else None


def load_tokenizer(name: str, roots: Sequence[str] = ()) -> Tokenizer:
    """`bytes`, a tokenizer.json, or a folder holding one (read under `roots`, if any)."""
    if name == BYTES:
        return ByteTokenizer()
    if os.path.isdir(name):
        text = _read(os.path.join(name, "tokenizer.json"), roots)
        return HFTokenizer(name, text, _eos_token(name, roots))
    return HFTokenizer(name, _read(name, roots))
