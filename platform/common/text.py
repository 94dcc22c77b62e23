"""Text a page can show: what users write into specs, names, tags and notes must be valid UTF-8
without control characters. JSON may spell a lone surrogate (`"\\ud800"`), which no UTF-8
answer can hold: stored, it broke every list that showed it.
"""

from __future__ import annotations

import re
from typing import Any

# C0 and C1 control characters, DEL, and the surrogates (lone: a JSON decoder pairs the rest)
_BAD = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# a note is prose: its lines and tabs are kept
_BAD_IN_PROSE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def text_error(value: str, prose: bool = False) -> str | None:
    """Why `value` is not text a page can show (None: it is). `prose` allows newlines and
    tabs."""
    bad = (_BAD_IN_PROSE if prose else _BAD).search(value)
    if bad is None:
        return None
    what = "a lone surrogate" if "\ud800" <= bad.group() <= "\udfff" else "a control character"
    return f"holds {what} (U+{ord(bad.group()):04X}) at character {bad.start()}; only " \
           "UTF-8 text without control characters is accepted"


def text_errors(value: Any, path: str = "") -> dict[str, str]:
    """Every string in a JSON value (object keys included) that is not text, by dotted path
    (list items by index: `train.dataset.paths.0`)."""
    if isinstance(value, str):
        error = text_error(value)
        return {} if error is None else {path or "body": error}
    errors: dict[str, str] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            key_error = text_error(str(key))
            if key_error is not None:
                # the key itself cannot name the field: it is what is wrong
                errors[f"{path}.{ascii(key)}" if path else ascii(key)] = f"the key {key_error}"
                continue
            errors.update(text_errors(item, where))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            errors.update(text_errors(item, f"{path}.{i}" if path else str(i)))
    return errors
