"""REST reads of a job's telemetry: metric series (`jobs/<id>/metrics/`), the goodput ledger
(`jobs/<id>/goodput/`), what one cause of it counts (`jobs/<id>/goodput/events/`) and the
anomalies the engine reported (`jobs/<id>/anomalies/`), actions routed beside the jobs API's
under its `jobs` prefix (monitor.urls); per-op timing (`jobs/<id>/ops/`,
`jobs/<id>/ops/history/`), expert load (`jobs/<id>/experts/`) and the batches the fault policy
found bad (`jobs/<id>/bad-batches/`); the per-user goodput summary over a time range
(`goodput/`) and the goodput as Prometheus gauges (`goodput/metrics/`). Query parameters are
validated; a bad one answers 400 naming it. Another user's job answers 404, as everywhere in
the API."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Q
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine.contract import CONTENT_TYPE, BadBatchEvent, labels
from jobs.errors import BAD_QUERY, ERRORS
from jobs.models import Checkpoint, Job
from jobs.permissions import visible_jobs
from jobs.serializers import JobEventSerializer
from monitor import goodput, lineage
from monitor.models import Anomaly, Event
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
        "data_ms, void_share, cpu_wait_ms (of step_ms, waiting for a core)}")),
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


MAX_BAD_BATCHES = 1000  # the newest; a run that finds more has a corpus to clean first


class BadBatchesView(JobTelemetryView):
    @extend_schema(
        responses={200: inline_serializer("BadBatches", {"bad_batches": serializers.ListField(
            child=inline_serializer("BadBatch", {
                "step": serializers.IntegerField(), "seq": serializers.IntegerField(),
                "anomaly": serializers.CharField(help_text="the kind that was rerun"),
                "ranks": serializers.ListField(child=serializers.IntegerField()),
                "samples": serializers.ListField(child=serializers.IntegerField(), help_text=(
                    "global sample indices: the loader's positions in the training stream")),
                "windows": serializers.ListField(child=serializers.IntegerField(), help_text=(
                    "the dataset windows they are: tokens window x seq_len onwards")),
                "evidence": serializers.DictField(),
            }))}), **ERRORS},
        description="The batches the fault policy's `rerun` found to cause a spike (it came "
                    f"back on the same data) and skipped, oldest first (the newest "
                    f"{MAX_BAD_BATCHES}).")
    def get(self, request: Request, job_id: int) -> Response:
        job = self.job(request, job_id)
        rows = Event.objects.filter(job=job, type=BadBatchEvent.type).order_by("-seq")
        fields = ("step", "seq", "anomaly", "ranks", "samples", "windows", "evidence")
        return Response({"bad_batches": [
            {name: data.get(name) for name in fields}
            for data in reversed(rows[:MAX_BAD_BATCHES].values_list("data", flat=True))]})


CAUSE_SECONDS = inline_serializer("GoodputCause", {
    "label": serializers.CharField(), "seconds": serializers.FloatField(),
    "share": serializers.FloatField(help_text="of the wall-clock time"),
})
GOODPUT = inline_serializer("Goodput", {
    "job": serializers.IntegerField(),
    "start": serializers.FloatField(help_text="the job's creation, seconds since the epoch"),
    "end": serializers.FloatField(help_text="its final state's time, or now"),
    "wall_s": serializers.FloatField(), "closed": serializers.BooleanField(
        help_text="final: the ledger no longer grows"),
    "productive_s": serializers.FloatField(),
    "goodput": serializers.FloatField(allow_null=True, help_text="productive_s / wall_s"),
    "open": serializers.CharField(allow_null=True, help_text="the cause the time since the "
                                  "last event accrues to (null once final)"),
    "causes": serializers.DictField(child=inline_serializer("GoodputCauseRefs", {
        "label": serializers.CharField(), "seconds": serializers.FloatField(),
        "share": serializers.FloatField(),
        "events": serializers.ListField(child=serializers.IntegerField(), help_text=(
            "sequence numbers of the events behind it (the newest 100)")),
        "transitions": serializers.ListField(child=serializers.IntegerField(), help_text=(
            "ids of the state transitions behind it (the newest 100)"))}),
        help_text=f"productive first, then each cause of loss: {', '.join(goodput.CAUSES)} "
                  "(monitor/goodput.py says what each counts); the seconds add up to wall_s"),
})


class GoodputCauseQuery(serializers.Serializer):
    cause = serializers.ChoiceField(choices=list(goodput.CAUSES),
                                    help_text="one of the ledger's causes")


class AnomalySerializer(serializers.ModelSerializer):
    class Meta:
        model = Anomaly
        fields = ["id", "seq", "step", "time", "kind", "severity", "rank", "evidence"]
        read_only_fields = fields


class JobTelemetryViewSet(viewsets.GenericViewSet):
    """The telemetry actions of a job, under the jobs API's routes (/api/jobs/<id>/...): only
    the caller's visible jobs, as jobs.api.JobViewSet's; another user's job answers 404."""

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user
            return Job.objects.none()
        return visible_jobs(self.request.user)

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
        cause = _valid(GoodputCauseQuery, request.query_params)["cause"]
        refs = goodput.current(job.pk)["causes"][cause]
        return Response({
            "cause": cause,
            "events": list(Event.objects.filter(job=job, seq__in=refs["events"])
                           .order_by("seq").values_list("data", flat=True)),
            "transitions": JobEventSerializer(job.transitions.filter(
                pk__in=refs["transitions"]), many=True).data})

    @extend_schema(responses={200: AnomalySerializer(many=True), **ERRORS}, filters=False,
                   description="The anomalies the engine reported (loss spikes, stragglers, "
                   "...), oldest first (paginated), each with its evidence.")
    @action(detail=True, methods=["get"])
    def anomalies(self, request: Request, pk: str) -> Response:
        page = self.paginate_queryset(Anomaly.objects.filter(job=self.get_object())
                                      .order_by("seq"))
        return self.get_paginated_response(AnomalySerializer(page, many=True).data)

    @extend_schema(parameters=[MetricsQuery], responses={200: SERIES, 400: BAD_QUERY,
                                                         **ERRORS}, filters=False,
                   description="Stored step metrics, downsampled server-side with a min/max "
                   "envelope (monitor.series).")
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        q = _valid(MetricsQuery, request.query_params)
        names = [n.strip() for n in q.get("names", "").split(",") if n.strip()]
        return Response({"series": metric_series(job.pk, names, q.get("from"), q.get("to"),
                                                 q["max_points"])})


class GoodputQuery(serializers.Serializer):
    since = serializers.DateTimeField(required=False, help_text="ISO 8601; default: a day "
                                      "before `until` (rounded down to the hour)")
    until = serializers.DateTimeField(required=False, help_text="ISO 8601; default: now "
                                      "(rounded up to the hour)")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        until = attrs.get("until") or timezone.now()
        since = attrs.get("since") or until - timedelta(days=1)
        if since >= until:
            raise serializers.ValidationError({"until": "must be after `since`"})
        return {"since": math.floor(since.timestamp() / goodput.HOUR) * goodput.HOUR,
                "until": math.ceil(until.timestamp() / goodput.HOUR) * goodput.HOUR}


def goodput_summary(jobs: Any, since: float, until: float) -> dict[str, Any]:
    """Seconds per cause of `jobs` within [since, until] (whole hours), in all and per job."""
    now = time.time()
    start, end = (datetime.fromtimestamp(t, tz=UTC) for t in (since, until))
    rows = []
    total = dict.fromkeys(goodput.CAUSES, 0.0)
    for job in (jobs.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=start),
                            created_at__lt=end).select_related("goodput")
                .order_by("created_at", "id")):
        seconds = goodput.of(job).within(since, until, now)
        wall = sum(seconds.values())
        if wall <= 0:
            continue
        rows.append({"id": job.pk, "name": job.name, "wall_s": wall,
                     "productive_s": seconds["productive"],
                     "goodput": seconds["productive"] / wall})
        for cause, value in seconds.items():
            total[cause] += value
    wall = sum(total.values())
    return {"since": since, "until": until, "wall_s": wall, "productive_s": total["productive"],
            "goodput": total["productive"] / wall if wall > 0 else None,
            "causes": {cause: {"label": label, "seconds": total[cause],
                               "share": total[cause] / wall if wall > 0 else 0.0}
                       for cause, label in goodput.CAUSES.items()},
            "jobs": rows}


class GoodputSummaryView(APIView):
    """Your jobs' goodput over a time range: the seconds of each cause that fell within it,
    summed over the jobs that ran in it, and each job's wall time and goodput there."""

    @extend_schema(
        parameters=[GoodputQuery],
        responses={200: inline_serializer("GoodputSummary", {
            "since": serializers.FloatField(help_text="seconds since the epoch, on the hour"),
            "until": serializers.FloatField(help_text="seconds since the epoch, on the hour"),
            "wall_s": serializers.FloatField(help_text="job-seconds within the range"),
            "productive_s": serializers.FloatField(),
            "goodput": serializers.FloatField(allow_null=True),
            "causes": serializers.DictField(child=CAUSE_SECONDS),
            "jobs": serializers.ListField(child=inline_serializer("GoodputOfJob", {
                "id": serializers.IntegerField(), "name": serializers.CharField(),
                "wall_s": serializers.FloatField(), "productive_s": serializers.FloatField(),
                "goodput": serializers.FloatField()}))}),
            400: BAD_QUERY, 401: ERRORS[401]},
        description="The range is widened to whole UTC hours (the ledger keeps its seconds "
                    "per hour); a bad or reversed range answers 400 naming the field.")
    def get(self, request: Request) -> Response:
        q = _valid(GoodputQuery, request.query_params)
        return Response(goodput_summary(Job.objects.filter(owner=request.user), q["since"],
                                        q["until"]))


# a finished job's gauges stay this long, so that a scrape sees its final ledger
METRICS_KEEP_S = 3600
GOODPUT_GAUGES = (
    ("goodput_seconds", "Seconds of the job's wall clock per cause: productive and each loss"),
    ("goodput_wall_seconds", "The job's wall-clock time from its creation to its end or now"),
    ("goodput_ratio", "Productive seconds over wall-clock seconds"),
)


def render_goodput(jobs: Any, now: float, prefix: str = "ringside_") -> str:
    """Prometheus text (format 0.0.4) of the goodput ledgers of `jobs`, as of `now`."""
    samples: dict[str, list[str]] = {name: [] for name, _ in GOODPUT_GAUGES}
    for job in jobs:
        ledger = goodput.of(job).view(now)
        job_labels = {"job": job.pk, "name": job.name, "owner": job.owner.get_username()}
        for cause, entry in ledger["causes"].items():
            samples["goodput_seconds"].append(
                f"{labels(**job_labels, cause=cause)} {entry['seconds']!r}")
        samples["goodput_wall_seconds"].append(f"{labels(**job_labels)} {ledger['wall_s']!r}")
        samples["goodput_ratio"].append(f"{labels(**job_labels)} {ledger['goodput'] or 0.0!r}")
    lines = []
    for name, help_text in GOODPUT_GAUGES:
        lines += [f"# HELP {prefix}{name} {help_text}", f"# TYPE {prefix}{name} gauge"]
        lines += [f"{prefix}{name}{sample}" for sample in samples[name]]
    return "\n".join(lines) + "\n"


class GoodputMetricsView(APIView):
    """Your jobs' goodput ledgers as Prometheus gauges (staff: everyone's), for a scraper
    holding an API token (`authorization: {type: Token, credentials: <key>}`)."""

    @extend_schema(responses={(200, "text/plain"): str, 401: ERRORS[401]},
                   description="Gauges `ringside_goodput_seconds{job,name,owner,cause}`, "
                   "`ringside_goodput_wall_seconds` and `ringside_goodput_ratio` of every job "
                   "not final, and of those that ended within the last hour.")
    def get(self, request: Request) -> HttpResponse:
        now = time.time()
        since = timezone.now() - timedelta(seconds=METRICS_KEEP_S)
        jobs = (visible_jobs(request.user)
                .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
                .select_related("owner", "goodput").order_by("id"))
        return HttpResponse(render_goodput(jobs, now), content_type=CONTENT_TYPE)


PARENT = inline_serializer("LineageParent", {
    "kind": serializers.CharField(help_text='"resume", "clone", "rollback" or "init_from"'),
    "path": serializers.CharField(), "step": serializers.IntegerField(allow_null=True),
    "checkpoint": serializers.IntegerField(allow_null=True, help_text=(
        "its checkpoint id; null where it is no checkpoint of a job you may see")),
    "job": serializers.IntegerField(allow_null=True),
})


class CheckpointLineageView(APIView):
    @extend_schema(
        responses={200: inline_serializer("CheckpointLineage", {
            "checkpoint": serializers.IntegerField(), "job": serializers.IntegerField(),
            "step": serializers.IntegerField(), "path": serializers.CharField(),
            "lineage": serializers.DictField(allow_null=True, help_text=(
                "as the engine recorded it: code_version, spec_sha256, sources (name, "
                "manifest_sha256, tokenizer_sha256, tokens), parents; null for a checkpoint "
                "saved before lineages")),
            "parents": serializers.ListField(child=PARENT, help_text="newest first")}),
            **ERRORS},
        description="What made the checkpoint: code, spec, data and the checkpoints it came "
                    "from (rollback, clone, init_from, resume), each resolved to its id.")
    def get(self, request: Request, checkpoint_id: int) -> Response:
        checkpoint = get_object_or_404(Checkpoint.objects.filter(
            job__in=visible_jobs(request.user)), pk=checkpoint_id)
        return Response(lineage.resolved(checkpoint, request.user))
