"""A rank's data file: a safetensors file holding its flat shards and its pickled extras.

    [8 bytes: header length N, little-endian][N bytes: JSON header, space-padded][data]

The header names every tensor with its dtype, shape and byte range in the data, which is
one contiguous buffer: the file is written as it sits in the staging buffer, with a few
large writes, and `safetensors.safe_open` (or any safetensors reader) opens it. The extras
are the uint8 tensor `EXTRAS`. safetensors allows no gaps between tensors, so the shards are
laid out by element size, largest first: every offset is then a multiple of its own
element size (a staging slice can be viewed as the shard's dtype) without padding.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

EXTRAS = "__extras__"
_HEADER_ALIGN = 64  # the data starts on a cache line

_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.uint16: "U16", torch.uint32: "U32",
    torch.uint64: "U64", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.complex64: "C64",
}


def layout(shards: dict[str, torch.Tensor], extras_nbytes: int,
           meta: dict[str, str]) -> tuple[bytes, dict[str, int], int]:
    """The header bytes (length prefix included), each tensor's byte offset in the file
    (`EXTRAS` for the extras) and the file's size, for flat `shards` (name -> tensor)."""
    for name, shard in shards.items():
        if shard.dtype not in _DTYPES:
            raise ValueError(f"tensors[{name!r}]: dtype {shard.dtype} has no safetensors code")
    order = sorted(shards, key=lambda n: (-shards[n].element_size(), n))
    entries: dict[str, Any] = {"__metadata__": meta}
    start = 0
    for name in order:
        size = shards[name].numel() * shards[name].element_size()
        entries[name] = {"dtype": _DTYPES[shards[name].dtype], "shape": [shards[name].numel()],
                         "data_offsets": [start, start + size]}
        start += size
    entries[EXTRAS] = {"dtype": "U8", "shape": [extras_nbytes],
                       "data_offsets": [start, start + extras_nbytes]}
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % _HEADER_ALIGN)
    data_start = 8 + len(text)
    offsets = {name: data_start + entries[name]["data_offsets"][0] for name in [*order, EXTRAS]}
    return struct.pack("<Q", len(text)) + text, offsets, data_start + start + extras_nbytes
