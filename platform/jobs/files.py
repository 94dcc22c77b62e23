"""A user's uploaded files (`/api/files/`): datasets and tokenizers their jobs may read.

Each user has a folder of their own (jobs.confinement.uploads_dir, one of their data roots);
an upload is written beside its final name and moved into place, so a job never reads half a
file. Names are plain file names: no folder, no `..`, nothing hidden.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.confinement import uploads_dir
from jobs.errors import FIELD_ERRORS, UNAUTHENTICATED

NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}$")
CHUNK_BYTES = 1 << 20


class UploadedFileSerializer(serializers.Serializer):
    name = serializers.CharField()
    path = serializers.CharField(help_text="what to put in a spec (train.dataset.paths, "
                                           "train.dataset.tokenizer)")
    size = serializers.IntegerField()


class UploadBody(serializers.Serializer):
    file = serializers.FileField(help_text="at most RINGSIDE_UPLOAD_MAX_BYTES")
    name = serializers.CharField(required=False, help_text="default: the uploaded file's name")

    def validate_file(self, upload):
        if upload.size > settings.UPLOAD_MAX_BYTES:
            raise serializers.ValidationError(
                f"over the upload limit of {settings.UPLOAD_MAX_BYTES} bytes")
        return upload

    def validate(self, data: dict) -> dict:
        name = data.get("name", data["file"].name)
        if name in (".", "..") or not NAME.match(name):
            raise serializers.ValidationError({"name" if "name" in data else "file": (
                "a plain file name: letters, digits, '_', '.', '+' or '-', not starting with "
                "'.', no folders")})
        return {"file": data["file"], "name": name}


def describe(path: Path) -> dict:
    return {"name": path.name, "path": str(path), "size": path.stat().st_size}


class FilesView(APIView):
    """Your uploaded files, which your jobs may read (their path in the spec)."""

    parser_classes = [MultiPartParser]

    @extend_schema(responses={200: UploadedFileSerializer(many=True), 401: UNAUTHENTICATED})
    def get(self, request: Request) -> Response:
        folder = uploads_dir(request.user)
        found = sorted(e.name for e in os.scandir(folder)
                       if e.is_file(follow_symlinks=False) and NAME.match(e.name)
                       ) if folder.is_dir() else []
        return Response(UploadedFileSerializer([describe(folder / n) for n in found],
                                               many=True).data)

    @extend_schema(request={"multipart/form-data": UploadBody},
                   responses={201: UploadedFileSerializer, 400: FIELD_ERRORS,
                              401: UNAUTHENTICATED, 413: FIELD_ERRORS},
                   description="Upload a file (multipart field `file`) into your folder, "
                   "replacing one of the same name; the answer's `path` is what a spec names.")
    def post(self, request: Request) -> Response:
        body = UploadBody(data=request.data)
        body.is_valid(raise_exception=True)
        folder = uploads_dir(request.user)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = folder / body.validated_data["name"]
        out = tempfile.NamedTemporaryFile(dir=folder, prefix=".upload-", delete=False)
        try:
            with out:
                for chunk in body.validated_data["file"].chunks(CHUNK_BYTES):
                    out.write(chunk)
            os.replace(out.name, target)  # replaces a link itself, never what it points to
        except BaseException:
            os.unlink(out.name)
            raise
        return Response(UploadedFileSerializer(describe(target)).data,
                        status=status.HTTP_201_CREATED)
