"""What a dataset may read: each source's files (globs) and its tokenizer, confined to the
registering user's data roots (jobs.confinement: their uploads and the operator's
RINGSIDE_DATA_ROOTS, by real path; a relative path is taken in the uploads folder), or an
object-store prefix among the operator's roots. The stored dataset holds the resolved paths,
and the prepare reads them confined to the same roots again (engine.runtime.confine)."""

from __future__ import annotations

import os
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from engine.contract import is_url
from engine.runtime.spec import OUTSIDE, is_under
from jobs.confinement import data_roots, in_uploads, resolved, resolved_pattern

KINDS = ("text", "jsonl", "parquet")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER = ("`bytes`, a tokenizer.json, or a Hugging Face tokenizer folder (holding a "
             "tokenizer.json) under your data roots")


def source_path(path: str, user: AbstractBaseUser, field: str, errors: dict[str, str]) -> str:
    """One source's glob resolved, or an object-store prefix the operator opened; else an
    error naming `field`, the same whether or not anything is there."""
    path = in_uploads(path, user)
    if is_url(path):
        if not is_under(path, data_roots(user)):
            errors[field] = OUTSIDE
        return path
    return resolved_pattern(path, user, field, errors)


def tokenizer_path(value: str, user: AbstractBaseUser, field: str,
                   errors: dict[str, str]) -> str:
    """`bytes`, or a tokenizer file or folder under the roots at its real path."""
    if value == "bytes":
        return value
    path = resolved(value, user, field, errors)
    if field in errors or is_url(path):
        errors.setdefault(field, TOKENIZER)
        return path
    if not (os.path.isfile(path) or os.path.isfile(os.path.join(path, TOKENIZER_FILE))):
        errors[field] = TOKENIZER
    return path


def confined_sources(sources: list[dict[str, Any]], user: AbstractBaseUser,
                     errors: dict[str, str]) -> list[dict[str, Any]]:
    """`sources` with every path resolved; what may not be read is added to `errors` as
    `sources.<i>.paths.<j>`."""
    return [{**source, "paths": [source_path(p, user, f"sources.{i}.paths.{j}", errors)
                                 for j, p in enumerate(source["paths"])]}
            for i, source in enumerate(sources)]
