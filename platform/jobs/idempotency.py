"""`Idempotency-Key` on POSTs: a retried request gets the first response, and does nothing.

The handler runs in one transaction with the insert of the key's row, so two racing requests
with the same key cannot both commit: the loser rolls back everything it did (no second job,
no second command) and replays the winner's stored response.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.models import IdempotencyKey

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255

PARAMETER = OpenApiParameter(
    HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    description="Any string up to 255 characters, unique per request you mean. A repeat of "
    "the same key by the same user gets the first response again (with the header "
    "`Idempotent-Replayed: true`) and has no effect; the same key on another endpoint is 422.")


def _replay(stored: IdempotencyKey, request: Request) -> Response:
    if (stored.method, stored.path) != (request.method, request.path):
        return Response({HEADER: [f"this key was used for {stored.method} {stored.path}; "
                                  "use a new key for another request"]},
                        status=status.HTTP_422_UNPROCESSABLE_ENTITY)
    return Response(stored.body, status=stored.status, headers={"Idempotent-Replayed": "true"})


def _storable(data: Any) -> Any:
    """`data` with U+0000 in its strings and keys replaced by U+FFFD: PostgreSQL's jsonb cannot
    hold it, and an error response may echo a client's NUL (an unknown field's name)."""
    if isinstance(data, str):
        return data.replace("\x00", "\ufffd")
    if isinstance(data, dict):
        return {_storable(k): _storable(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_storable(v) for v in data]
    return data


def idempotent(handler: Callable[..., Response]) -> Callable[..., Response]:
    """Make a POST view method replay its first response for a repeated Idempotency-Key."""

    @functools.wraps(handler)
    def wrapper(self, request: Request, *args, **kwargs) -> Response:
        key = request.headers.get(HEADER)
        if key is None:
            return handler(self, request, *args, **kwargs)
        if not key or len(key) > MAX_KEY_LENGTH:
            return Response({HEADER: [f"must be 1 to {MAX_KEY_LENGTH} characters"]},
                            status=status.HTTP_400_BAD_REQUEST)
        stored = IdempotencyKey.objects.filter(user=request.user, key=key).first()
        if stored is not None:
            return _replay(stored, request)
        try:
            with transaction.atomic():
                response = handler(self, request, *args, **kwargs)
                if response.status_code < 500:
                    IdempotencyKey.objects.create(
                        user=request.user, key=key, method=request.method, path=request.path,
                        status=response.status_code, body=_storable(response.data))
        except IntegrityError:
            stored = IdempotencyKey.objects.filter(user=request.user, key=key).first()
            if stored is None:  # not the key's constraint: a real error
                raise
            return _replay(stored, request)  # a concurrent request with this key won
        return response

    return wrapper
