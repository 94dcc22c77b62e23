"""A job's telemetry reads, mixed into jobs.api.JobViewSet: its goodput ledger, what one
cause of it counts, and its stored step metrics (monitor)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.errors import BAD_QUERY, ERRORS
from jobs.serializers import JobEventSerializer
from monitor import goodput
from monitor.api import GOODPUT, SERIES, GoodputCauseQuery, MetricsQuery, metrics_payload
from monitor.models import Event


class JobTelemetry:
    """The actions of a job's telemetry; `get_object` is the viewset's (visible jobs only)."""

    @extend_schema(responses={200: GOODPUT, **ERRORS}, filters=False,
                   description="The goodput ledger: the job's wall-clock time so far split into "
                   "productive training and each cause of loss, with each cause's seconds, "
                   "share and the events and state transitions behind it (monitor.goodput).")
    @action(detail=True, methods=["get"])
    def goodput(self, request: Request, pk: str) -> Response:
        return Response(goodput.current(self.get_object().pk))

    @extend_schema(
        parameters=[GoodputCauseQuery],
        responses={200: inline_serializer("GoodputCauseEvents", {
            "cause": serializers.CharField(),
            "events": serializers.ListField(child=serializers.DictField(), help_text=(
                "the stored events behind it, as published, oldest first")),
            "transitions": JobEventSerializer(many=True)}), 400: BAD_QUERY, **ERRORS},
        filters=False, description="What one cause of the goodput ledger counts: the events "
        "and state transitions behind it (the newest 100 of each).")
    @action(detail=True, methods=["get"], url_path="goodput/events", url_name="goodput-events")
    def goodput_events(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        query = GoodputCauseQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        cause = query.validated_data["cause"]
        refs = goodput.current(job.pk)["causes"][cause]
        return Response({
            "cause": cause,
            "events": list(Event.objects.filter(job=job, seq__in=refs["events"])
                           .order_by("seq").values_list("data", flat=True)),
            "transitions": JobEventSerializer(job.transitions.filter(
                pk__in=refs["transitions"]), many=True).data})

    @extend_schema(parameters=[MetricsQuery], responses={200: SERIES, 400: BAD_QUERY,
                                                         **ERRORS}, filters=False,
                   description="Stored step metrics, downsampled server-side with a min/max "
                   "envelope (monitor.series).")
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        return Response(metrics_payload(job.pk, request.query_params))
