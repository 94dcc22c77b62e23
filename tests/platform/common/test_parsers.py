"""common.parsers: the API's JSON bodies are bounded in depth (400) and size (413, also for a
body sent without a Content-Length), each answered as `{"detail": ...}`; a deep body was a
500 (the decoder's RecursionError)."""

from __future__ import annotations

import io
import json

import pytest
from django.conf import settings
from rest_framework.exceptions import ParseError

from common.parsers import BodyTooLarge, BoundedJSONParser, json_depth
from jobs.models import Job

pytestmark = pytest.mark.django_db


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("text, depth", [
    ("1", 0), ('{"a": [1, {"b": 2}]}', 3), (nested(5), 5),
    # brackets inside strings, escaped quotes included, nest nothing
    ('{"a": "[[[{{\\"[[["}', 1), ('["\\\\", ["]"]]', 2),
])
def test_json_depth_counts_only_the_brackets_outside_strings(text, depth):
    assert json_depth(text.encode()) == depth


def test_a_body_nested_past_the_limit_is_a_400_in_the_api_shape(api):
    most = settings.RINGSIDE_JSON_MAX_DEPTH
    answer = api.post("/api/jobs/", '{"name": "x", "model": ' + nested(most) + "}",
                      content_type="application/json")
    assert answer.status_code == 400
    assert answer.json() == {"detail": f"JSON nested deeper than {most} levels"}
    # the attack as reported: a thousand levels, on another endpoint too
    for path in ("/api/jobs/", "/api/tokens/", "/api/webhooks/"):
        deep = api.post(path, nested(1000), content_type="application/json")
        assert deep.status_code == 400, path
        assert "nested deeper" in deep.json()["detail"]
    assert not Job.objects.exists()


def test_a_body_at_the_depth_limit_is_parsed(api, small_spec):
    answer = api.post("/api/jobs/", json.dumps(small_spec), content_type="application/json")
    assert answer.status_code == 201, answer.json()
    most = settings.RINGSIDE_JSON_MAX_DEPTH
    parsed = BoundedJSONParser().parse(io.BytesIO(nested(most).encode()))
    assert json.dumps(parsed) == nested(most)


def test_a_body_without_a_length_is_bounded_as_it_is_read(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10
    parser = BoundedJSONParser()
    with pytest.raises(BodyTooLarge) as too_big:
        parser.parse(io.BytesIO(b'{"name": "eleven+"}'))
    assert too_big.value.status_code == 413
    assert str(too_big.value.detail) == "request body over 10 bytes"
    assert parser.parse(io.BytesIO(b'{"a": 1}')) == {"a": 1}
    with pytest.raises(ParseError):
        parser.parse(io.BytesIO(b"[NaN]"))  # DRF's strictness is kept
