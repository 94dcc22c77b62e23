"""The API's answers to bodies it will not read, as JSON like its other errors.

A body over DATA_UPLOAD_MAX_MEMORY_SIZE (an upload: over UPLOAD_MAX_BYTES) is refused before
any view reads it: DRF's parsers read the request stream, which Django does not limit, and
Django's own check (on `.body`) answers with its HTML 400 page. A body of another media type
than a view parses is DRF's 415, with the type to use added.
"""

from __future__ import annotations

from collections.abc import Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.exceptions import UnsupportedMediaType
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

FILES_PATH = "/api/files/"  # uploads (jobs.files), limited by UPLOAD_MAX_BYTES instead


def exception_handler(exc: Exception, context: dict) -> Response | None:
    response = drf_exception_handler(exc, context)
    if isinstance(exc, UnsupportedMediaType) and response is not None:
        response.data = {"detail": f"{exc.detail.rstrip('.')}; use application/json"}
    return response


# room for the multipart framing around an uploaded file of the largest size
MULTIPART_SLACK_BYTES = 64 << 10


def _too_big(request: HttpRequest) -> HttpResponse | None:
    upload = request.path == FILES_PATH
    limit = (settings.UPLOAD_MAX_BYTES + MULTIPART_SLACK_BYTES if upload
             else settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    if limit is None or not request.path.startswith("/api/"):
        return None
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length <= limit:
        return None
    if upload:  # named as the upload's own check names it (jobs.files)
        return JsonResponse({"file": [f"over the upload limit of {settings.UPLOAD_MAX_BYTES} "
                                      "bytes"]}, status=413)
    return JsonResponse({"detail": f"request body over {limit} bytes"}, status=413)


class BodyLimitMiddleware:
    """A JSON 413 for an API request whose Content-Length is over the upload limit."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if iscoroutinefunction(self):
            return self._acall(request)
        return _too_big(request) or self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        return _too_big(request) or await self.get_response(request)
