"""The API's JSON parser, bounded: a body over DATA_UPLOAD_MAX_MEMORY_SIZE is a 413 and JSON
nested deeper than RINGSIDE_JSON_MAX_DEPTH a 400, both as `{"detail": ...}` like the API's other
errors. Python's decoder recurses once per level: a thousand-deep body was a RecursionError,
answered 500. ringside.api_errors refuses a body whose Content-Length is over the limit before
any view runs; this bounds one sent without a length (chunked) as it is read.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

# JSON strings (whose brackets do not nest anything) and the brackets outside them
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


class BodyTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "body_too_large"


def json_depth(body: bytes) -> int:
    """How deep the JSON text's arrays and objects nest (0: a scalar)."""
    deepest = depth = 0
    for bracket in _BRACKET.findall(_STRING.sub(b"", body)):
        depth += 1 if bracket in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


class BoundedJSONParser(JSONParser):
    def parse(self, stream: IO[bytes], media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE  # None: Django's "no limit"
        body = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(body) > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
        most = settings.RINGSIDE_JSON_MAX_DEPTH
        if json_depth(body) > most:
            raise ParseError(f"JSON nested deeper than {most} levels")
        return super().parse(io.BytesIO(body), media_type, parser_context)
