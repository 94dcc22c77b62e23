"""REST API: datasets (`/api/datasets/`): register, read, prepare, share, delete.

Owned like jobs: a user sees their own and the shared ones (another user's answers 404); only
the owner (or staff) prepares or deletes one, and only staff share one with everyone. A
dataset an unfinished job trains on is not deleted (409 naming the jobs).
"""

from __future__ import annotations

import shutil

from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from common.parsers import BoundedJSONParser
from datasets import tasks
from datasets.models import Dataset, DatasetState, visible_datasets
from datasets.serializers import (
    DatasetBody,
    DatasetSerializer,
    PrepareBody,
    SharedBody,
    dotted,
)
from engine.contract import is_url
from jobs.errors import BAD_BODY, DETAIL, UNAUTHENTICATED
from jobs.models import AuditEntry
from jobs.permissions import request_cause

ERRORS = {401: UNAUTHENTICATED,
          403: OpenApiResponse(DETAIL, description="not yours to change"),
          404: OpenApiResponse(DETAIL, description="no such dataset, or not yours")}
CONFLICT = {409: OpenApiResponse(DETAIL, description="its state does not allow it: `detail` "
                                 "says why")}


@extend_schema_view(
    list=extend_schema(description="Your datasets and the shared ones, newest first."),
    retrieve=extend_schema(responses={200: DatasetSerializer, **ERRORS}),
    create=extend_schema(request=DatasetBody, responses={
        201: DatasetSerializer, 400: BAD_BODY, 401: UNAUTHENTICATED},
        description="Register a dataset: its sources (text files, JSONL with a field, Parquet "
        "with a column; files or globs under your data roots, or an object-store prefix the "
        "operator opened), its tokenizer and held-out fraction. Nothing is read until "
        "`prepare`."),
    partial_update=extend_schema(request=SharedBody, responses={
        200: DatasetSerializer, 400: BAD_BODY, **ERRORS},
        description="Staff: share it with everyone (`shared`), or not."),
    destroy=extend_schema(responses={204: None, **ERRORS, **CONFLICT},
                          description="Delete it and its prepared folder; 409 while it "
                          "prepares or an unfinished job trains on it."),
)
class DatasetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                     mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Your datasets (and the shared ones). Another user's answers 404."""

    serializer_class = DatasetSerializer
    parser_classes = [BoundedJSONParser]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Dataset.objects.none()
        return visible_datasets(self.request.user)

    def _owned(self) -> Dataset:
        """The dataset of the URL, if the user may change it (its owner, or staff)."""
        dataset = self.get_object()
        if dataset.owner != self.request.user and not self.request.user.is_staff:
            raise PermissionDenied("a shared dataset is changed by its owner only")
        return dataset

    def create(self, request: Request) -> Response:
        body = DatasetBody(data=request.data, context={"request": request})
        if not body.is_valid():
            return Response(dotted(body.errors), status=status.HTTP_400_BAD_REQUEST)
        dataset = Dataset.objects.create(owner=request.user, **body.validated_data)
        AuditEntry.record("dataset.create", request.user.get_username(),
                          request_cause(request), user=request.user, dataset=dataset.pk,
                          name=dataset.name)
        return Response(DatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request: Request, pk: str) -> Response:
        dataset = self.get_object()
        if not request.user.is_staff:
            raise PermissionDenied("only staff share a dataset with everyone")
        body = SharedBody(dataset, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        body.save()
        return Response(DatasetSerializer(dataset).data)

    @extend_schema(request=PrepareBody, responses={202: DatasetSerializer, **ERRORS,
                                                   **CONFLICT},
                   description="Tokenise it on a worker into the platform's storage: 202, "
                   "then `state` goes preparing → ready (with its `manifest`) or failed (with "
                   "its `error`), and `progress` tells documents, tokens, MB/s and ETA on the "
                   "way. A failed prepare, or one whose worker was lost, is queued again and "
                   "resumes from its last finished shard; 409 while one is under way or once "
                   "it is ready.")
    @action(detail=True, methods=["post"], serializer_class=PrepareBody)
    def prepare(self, request: Request, pk: str) -> Response:
        with transaction.atomic():
            dataset = self._owned()
            dataset = Dataset.objects.select_for_update().get(pk=dataset.pk)
            if dataset.state == DatasetState.READY:
                return _conflict(f"dataset {dataset.name!r} is prepared already")
            if dataset.state == DatasetState.PREPARING and not tasks.stale(dataset):
                return _conflict(f"dataset {dataset.name!r} is being prepared")
            tasks.queue(dataset)
        return Response(DatasetSerializer(dataset).data, status=status.HTTP_202_ACCEPTED)

    def destroy(self, request: Request, pk: str) -> Response:
        dataset = self._owned()
        jobs = list(dataset.active_jobs().values_list("pk", flat=True))
        if jobs:
            return _conflict(f"dataset {dataset.name!r} is in use by unfinished job(s) "
                             f"{', '.join(map(str, jobs))}: cancel them or let them finish")
        if dataset.state == DatasetState.PREPARING and not tasks.stale(dataset):
            return _conflict(f"dataset {dataset.name!r} is being prepared")
        folder = dataset.folder
        dataset.delete()
        if folder and not is_url(folder):
            shutil.rmtree(folder, ignore_errors=True)
        AuditEntry.record("dataset.delete", request.user.get_username(),
                          request_cause(request), user=request.user, dataset=int(pk),
                          name=dataset.name)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _conflict(detail: str) -> Response:
    return Response({"detail": detail}, status=status.HTTP_409_CONFLICT)
