"""REST reads of a job's telemetry: metric series (`jobs/<id>/metrics/`, served by the jobs
API through `metrics_payload`), per-op timing (`jobs/<id>/ops/`, `jobs/<id>/ops/history/`)
and expert load (`jobs/<id>/experts/`). Query parameters are validated; a bad one answers 400
naming it. Another user's job answers 404, as everywhere in the API."""

from __future__ import annotations

from typing import Any

from django.http import Http404
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.errors import BAD_QUERY, ERRORS
from jobs.models import Job
from jobs.permissions import visible_jobs
from monitor.series import (
    DEFAULT_MAX_POINTS,
    MAX_POINTS_LIMIT,
    expert_history,
    metric_series,
    ops_history,
    ops_sample,
)


class WindowQuery(serializers.Serializer):
    """A step window `from`..`to` (inclusive, both optional) and a point budget."""

    to = serializers.IntegerField(min_value=0, required=False, help_text="last step (inclusive)")
    max_points = serializers.IntegerField(
        min_value=2, max_value=MAX_POINTS_LIMIT, default=DEFAULT_MAX_POINTS,
        help_text="at most this many points per series; a window with no more steps than "
                  "this is returned exactly")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # `from` is a Python keyword, so it cannot be a class attribute
        fields["from"] = serializers.IntegerField(min_value=0, required=False,
                                                  help_text="first step (inclusive)")
        return fields

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "from" in attrs and "to" in attrs and attrs["from"] > attrs["to"]:
            raise serializers.ValidationError({"to": "must not be before `from`"})
        return attrs


class MetricsQuery(WindowQuery):
    names = serializers.CharField(required=False, help_text='comma-separated, e.g. "loss,lr"; '
                                                           "default: every stored metric")


class OpsQuery(serializers.Serializer):
    step = serializers.IntegerField(min_value=0, required=False,
                                    help_text="default: the latest step with op timings")


def _valid(query: type[serializers.Serializer], params: Any) -> dict[str, Any]:
    checked = query(data=params)
    checked.is_valid(raise_exception=True)
    return checked.validated_data


SERIES = inline_serializer("MetricSeries", {"series": serializers.DictField(
    child=serializers.DictField(child=serializers.ListField()),
    help_text='{name: {"step": [...], "value": [...], "min": [...], "max": [...]}}; each point '
              "is a bucket of steps (its first step, mean, min and max), or one step when the "
              "window fits in max_points; value is null where a step was NaN/inf")})


def metrics_payload(job_id: int, params: Any) -> dict[str, Any]:
    """The body of GET jobs/<id>/metrics/ for query `params`; raises ValidationError."""
    q = _valid(MetricsQuery, params)
    names = [n.strip() for n in q.get("names", "").split(",") if n.strip()]
    return {"series": metric_series(job_id, names, q.get("from"), q.get("to"),
                                    q["max_points"])}


class JobTelemetryView(APIView):
    def job(self, request: Request, job_id: int) -> Job:
        return get_object_or_404(visible_jobs(request.user), pk=job_id)


OP = inline_serializer("OpTiming", {
    "kind": serializers.CharField(help_text="compute, matmul, collective, data, host, ..."),
    "count": serializers.IntegerField(), "total_ms": serializers.FloatField(),
    "mean_ms": serializers.FloatField(), "max_ms": serializers.FloatField(),
    "slowest_rank": serializers.IntegerField(),
    "per_rank_ms": serializers.ListField(child=serializers.FloatField()),
    "bytes": serializers.IntegerField(required=False, help_text="collectives"),
    "group": serializers.CharField(required=False, help_text="collectives"),
    "busbw_gbps": serializers.FloatField(required=False, help_text="collectives"),
    "tflops": serializers.FloatField(required=False, help_text="matmuls"),
})
OPS_SAMPLE = inline_serializer("OpsSample", {
    "step": serializers.IntegerField(), "seq": serializers.IntegerField(),
    "step_ms": serializers.FloatField(allow_null=True),
    "void_share": serializers.FloatField(allow_null=True),
    "data_wait_share": serializers.FloatField(allow_null=True),
    "ops": serializers.DictField(child=OP),
    "ranks": serializers.ListField(child=serializers.DictField(), help_text=(
        "per rank: {rank, step_ms, compute_ms (step less collectives and data), comm_ms, "
        "data_ms, void_share}")),
})


class OpsView(JobTelemetryView):
    @extend_schema(parameters=[OpsQuery], responses={200: OPS_SAMPLE, 400: BAD_QUERY, **ERRORS},
                   description="One step's per-op timing aggregated over ranks (the latest "
                               "step by default); 404 when the job has none for that step.")
    def get(self, request: Request, job_id: int) -> Response:
        job = self.job(request, job_id)
        sample = ops_sample(job.pk, _valid(OpsQuery, request.query_params).get("step"))
        if sample is None:
            raise Http404("no op timings stored for that step")
        return Response(sample)


class OpsHistoryView(JobTelemetryView):
    @extend_schema(
        parameters=[WindowQuery],
        responses={200: inline_serializer("OpsHistory", {
            "step": serializers.ListField(child=serializers.IntegerField()),
            "step_ms": serializers.ListField(child=serializers.FloatField(allow_null=True)),
            "ops": serializers.DictField(child=inline_serializer("OpSeries", {
                "kind": serializers.CharField(),
                "total_ms": serializers.ListField(child=serializers.FloatField(allow_null=True)),
                "max_ms": serializers.ListField(child=serializers.FloatField(allow_null=True)),
                "slowest_rank": serializers.ListField(
                    child=serializers.IntegerField(allow_null=True)),
            }))}), 400: BAD_QUERY, **ERRORS},
        description="Time per op over steps; over max_points steps, each bucket of steps is "
                    "represented by its slowest step.")
    def get(self, request: Request, job_id: int) -> Response:
        job = self.job(request, job_id)
        q = _valid(WindowQuery, request.query_params)
        return Response(ops_history(job.pk, q.get("from"), q.get("to"), q["max_points"]))


class ExpertsView(JobTelemetryView):
    @extend_schema(
        parameters=[WindowQuery],
        responses={200: inline_serializer("ExpertHistory", {"samples": serializers.ListField(
            child=inline_serializer("ExpertSample", {
                "step": serializers.IntegerField(),
                "max_violation": serializers.FloatField(allow_null=True),
                "dead_experts": serializers.IntegerField(),
                "tokens_per_expert": serializers.ListField(
                    child=serializers.ListField(child=serializers.IntegerField()),
                    help_text="[layer][expert]"),
            }))}), 400: BAD_QUERY, **ERRORS},
        description="Tokens routed to each expert of each MoE layer, per step; over "
                    "max_points steps, each bucket is represented by its most imbalanced step.")
    def get(self, request: Request, job_id: int) -> Response:
        job = self.job(request, job_id)
        q = _valid(WindowQuery, request.query_params)
        return Response({"samples": expert_history(job.pk, q.get("from"), q.get("to"),
                                                   q["max_points"])})
