"""REST API: jobs (create, read, steer, clone), the planner, API tokens, webhooks, the audit log.

Views stay thin: bodies are validated by serializers, state moves are Job methods, steering
goes through jobs.steering. Every POST takes an `Idempotency-Key` (jobs.idempotency).
"""

from __future__ import annotations

import json

from django.conf import settings
from django.db import transaction
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import generics, mixins, serializers, status, viewsets
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, Throttled
from rest_framework.filters import OrderingFilter
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.parsers import BoundedJSONParser
from common.text import text_errors
from engine.contract import COMMAND_RULES, CommandKind, ProposalStatus
from engine.paro.planner import DEFAULT_LINKS
from engine.runtime.spec import SpecError, launched_values, parse_spec
from jobs import (
    admission,
    calibration,
    confinement,
    evaluations,
    exports,
    idempotency,
    proposals,
)
from jobs.backends import options as backend_options
from jobs.errors import (
    BAD_BODY,
    BAD_QUERY,
    CREATE_ERRORS,
    DETAIL,
    ERRORS,
    FIELD_ERRORS,
    STEER_ERRORS,
    UNAUTHENTICATED,
)
from jobs.idempotency import idempotent
from jobs.login import LoginAccountThrottle, LoginAddressThrottle
from jobs.mixtures import mixtures
from jobs.models import (
    ApiToken,
    AuditEntry,
    Evaluation,
    Export,
    IllegalTransition,
    Job,
    State,
    Webhook,
)
from jobs.permissions import request_cause, token_creation_wait, visible_jobs
from jobs.policy import PlatformPolicy, PolicyError
from jobs.serializers import (
    AnomalySerializer,
    ApiTokenSerializer,
    AuditEntrySerializer,
    CheckpointSerializer,
    CloneBody,
    CommandBody,
    CommandRulesSerializer,
    CommandSerializer,
    DecideBody,
    EvaluationSerializer,
    ExportSerializer,
    JobDetailSerializer,
    JobEventSerializer,
    JobNoteSerializer,
    JobOptions,
    JobSerializer,
    NewApiTokenSerializer,
    NewWebhookSerializer,
    PauseBody,
    PlanQuery,
    PlanSerializer,
    ProposalSerializer,
    RebalanceBody,
    ReshardBody,
    RollbackBody,
    SetBody,
    WebhookSerializer,
    job_rollbacks,
)
from jobs.steering import audit, issue
from monitor import goodput
from monitor.api import GOODPUT, SERIES, GoodputCauseQuery, MetricsQuery, metrics_payload
from monitor.models import Action, Anomaly, Checkpoint, Event
from monitor.sinks import options as sink_options


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"

    def __init__(self, error: IllegalTransition):
        super().__init__({"detail": str(error), "state": error.state})


class ProposalDecided(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "proposal_decided"

    def __init__(self, proposal: dict):
        super().__init__({"detail": proposals.why_not_pending(proposal),
                          "status": proposal["status"]})


QUOTA_REACHED = OpenApiResponse(DETAIL, description="the user's jobs quota is reached")
# what every steering action answers
STEERED = {202: CommandSerializer, **STEER_ERRORS}
# what an export's POST answers besides its record: its own 409 says why, without a state
EXPORT_ERRORS = {**STEER_ERRORS, 409: OpenApiResponse(DETAIL, description="the checkpoint "
                                                      "is in the memory tier, or was deleted")}


def actor(request: Request) -> str:
    return request.user.get_username()


class JobFilter(filters.FilterSet):
    # distinct=False: a job has one state, so no duplicates to remove; the default DISTINCT
    # compared every column, the spec's JSON included, on each filtered list and its count
    state = filters.MultipleChoiceFilter(choices=State.choices, distinct=False,
                                         help_text="one or more states (repeat the parameter)")
    owner = filters.CharFilter(field_name="owner__username", help_text="owner's username")
    name = filters.CharFilter(lookup_expr="icontains", help_text="part of the job name")
    tag = filters.CharFilter(method="with_tag", help_text="one of the job's tags")

    class Meta:
        model = Job
        fields = ["state", "owner", "name", "tag"]

    def with_tag(self, jobs, name: str, tag: str):
        # the stored list's JSON text holds `"tag"` with its quotes: an exact element match
        # on PostgreSQL and SQLite alike (tags never contain quotes; JSON `contains` is
        # PostgreSQL's only)
        return jobs.filter(tags__icontains=json.dumps(tag.lower()))


BACKEND_FIELDS = ("backend", "slurm")  # jobs.backends.options: beside the spec, not in it


def _hosts_asked(data: dict) -> int:
    """The hosts a create body asks for, as the backend's limits count them (a malformed
    value is the spec's to report)."""
    parallel = data.get("parallel")
    hosts = parallel.get("hosts", 1) if isinstance(parallel, dict) else 1
    return hosts if isinstance(hosts, int) and not isinstance(hosts, bool) else 1


@extend_schema_view(
    list=extend_schema(description="Your jobs (staff: everyone's), newest first unless "
                       "`ordering` says otherwise; paginated with `limit`/`offset`.",
                       responses={200: JobSerializer(many=True), 400: BAD_QUERY,
                                  401: UNAUTHENTICATED}),
    retrieve=extend_schema(responses={200: JobDetailSerializer, **ERRORS}),
)
class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Your jobs (staff: everyone's). Another user's job answers 404."""

    filter_backends = [filters.DjangoFilterBackend, OrderingFilter]
    filterset_class = JobFilter
    parser_classes = [BoundedJSONParser]  # a form or multipart body is a 415
    ordering_fields = ["created_at", "id", "name", "state", "step"]
    ordering = ["-created_at", "-id"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user
            return Job.objects.none()
        # one query for every listed job's placement (Job.placement reads the prefetch)
        return visible_jobs(self.request.user).prefetch_related("reservations__host")

    def get_serializer_class(self):
        return JobDetailSerializer if self.action == "retrieve" else JobSerializer

    @extend_schema(
        request=OpenApiTypes.OBJECT,
        parameters=[idempotency.PARAMETER],
        responses={201: JobDetailSerializer, 400: CREATE_ERRORS, 401: UNAUTHENTICATED,
                   422: STEER_ERRORS[422], 429: QUOTA_REACHED},
        description="Body: the job spec itself (DESIGN.md §3), plus an optional `platform` "
        "object, the platform's fault policy for the job (`max_auto_actions_per_hour`, "
        "`resume_on_failure`; jobs/policy.py), and an optional `priority` (-100..100, default 0: "
        "placement order, higher first; at most RINGSIDE_MAX_USER_PRIORITY unless staff), and "
        "optional `sinks`, the trackers it writes to (`\"tensorboard\"`, `{\"kind\": \"mlflow\", "
        "\"tracking_uri\": ...}`, `{\"kind\": \"wandb\", \"mode\": \"offline\"}`; default: "
        "yours at /api/me/sinks/; monitor.sinks.options). An "
        "invalid body, or a model no registered host's memory holds in any strategy, answers "
        "400 with `errors`, a map from each bad field's dotted path to a message; 429 at the "
        "user's jobs quota (jobs.admission).",
        examples=[OpenApiExample("nano", value={
            "name": "demo", "model": {"preset": "nano"}, "train": {"steps": 20},
            "platform": {"resume_on_failure": 1}})],
    )
    @idempotent
    def create(self, request: Request) -> Response:
        data = request.data
        errors: dict[str, str] = {}
        policy = PlatformPolicy()
        extras = JobOptions().fields  # the platform's own fields beside the spec
        options = JobOptions(data={})
        sinks = None  # the owner's defaults
        backend: tuple[str, dict] = (settings.BACKEND, {})
        if isinstance(data, dict):
            options = JobOptions(data={k: v for k, v in data.items() if k in extras})
            backend = backend_options.parse(data, _hosts_asked(data), errors)
            data = {k: v for k, v in data.items()
                    if k not in ("platform", "sinks", *BACKEND_FIELDS) and k not in extras}
            try:
                policy = PlatformPolicy.parse(request.data.get("platform"))
            except PolicyError as e:
                errors.update(e.errors)
            try:
                sinks = (sink_options.parse(request.data["sinks"])
                         if "sinks" in request.data else None)
            except sink_options.SinkError as e:
                errors.update(e.errors)
        if not options.is_valid():
            errors.update({k: " ".join(map(str, v)) for k, v in options.errors.items()})
        unreadable = text_errors(request.data)
        if unreadable:  # nothing else reads a string that is not text (a path, a name)
            return Response({"errors": {**errors, **unreadable}},
                            status=status.HTTP_400_BAD_REQUEST)
        data = confinement.confine(data, request.user, errors)
        try:
            spec = parse_spec(data).to_dict()
        except SpecError as e:
            errors.update(e.errors)
        if errors:
            return Response({"errors": errors}, status=status.HTTP_400_BAD_REQUEST)
        admission.admit(request.user, spec, options.validated_data["priority"])
        job = self._launch(request, spec, policy, "job.create", sinks=sinks, backend=backend,
                           **options.validated_data)
        return Response(JobDetailSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=JobNoteSerializer,
                   responses={200: JobDetailSerializer, 400: BAD_BODY, **ERRORS},
                   description="Change the job's `tags` and `note`, nothing else; audited.")
    def partial_update(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        body = JobNoteSerializer(job, data=request.data, partial=True)
        if not isinstance(request.data, dict) or set(request.data) - set(body.fields):
            return Response({"non_field_errors": ["only `tags` and `note` can be changed"]},
                            status=status.HTTP_400_BAD_REQUEST)
        body.is_valid(raise_exception=True)
        body.save()
        audit("job.annotate", actor(request), request_cause(request), job=job,
              **body.validated_data)
        return Response(JobDetailSerializer(job).data)

    def _launch(self, request: Request, spec: dict, policy: PlatformPolicy, what: str,
                resume_from: str = "", priority: int = 0,
                sinks: list[dict[str, str]] | None = None,
                backend: tuple[str, dict] = (settings.BACKEND, {}), **details) -> Job:
        from jobs.tasks import dispatch

        with transaction.atomic():
            job = Job.objects.create(name=spec["name"], owner=request.user, spec=spec,
                                     platform=policy.to_dict(), resume_from=resume_from,
                                     priority=priority, backend=backend[0],
                                     backend_options=backend[1])
            sink_options.attach(job, sinks)
            mixtures().record_use(job)
            audit(what, actor(request), request_cause(request), job=job, **details)
            dispatch(job)
        return job

    def _steer(self, request: Request, kind: CommandKind, body: type[CommandBody],
               **context) -> Response:
        """Validate the body, issue the command, answer 202 with it (409 when the job's state
        does not allow it)."""
        job = self.get_object()
        if not isinstance(request.data, dict):
            return Response({"non_field_errors": ["the body must be a JSON object"]},
                            status=status.HTTP_400_BAD_REQUEST)
        validator = body(data=request.data, context={"job": job, **context})
        validator.is_valid(raise_exception=True)
        data = validator.validated_data
        try:
            command = issue(job, kind, data["args"], engine_args=data["engine_args"],
                            actor=actor(request), cause=request_cause(request))
        except IllegalTransition as e:
            raise Conflict(e) from e
        return Response(CommandSerializer(command).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=PauseBody, responses=STEERED, parameters=[idempotency.PARAMETER],
                   description="Cold (default): checkpoint at the next step boundary and stop, "
                   "freeing the worker (running → pausing → paused). `{\"mode\": \"warm\"}`: "
                   "the ranks idle at the step boundary with their state in memory, holding "
                   "the worker, until a resume (or `max_s`, then it turns cold).")
    @action(detail=True, methods=["post"])
    @idempotent
    def pause(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.PAUSE, PauseBody)

    @extend_schema(request=CommandBody, responses=STEERED, parameters=[idempotency.PARAMETER],
                   description="Queue a paused job again; it continues from its newest "
                   "checkpoint.")
    @action(detail=True, methods=["post"])
    @idempotent
    def resume(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.RESUME, CommandBody)

    @extend_schema(request=CommandBody, responses=STEERED, parameters=[idempotency.PARAMETER],
                   description="Queued and paused jobs are cancelled at once; a running one "
                   "stops at its next step boundary (or by signal within seconds).")
    @action(detail=True, methods=["post"])
    @idempotent
    def cancel(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.CANCEL, CommandBody)

    @extend_schema(request=RollbackBody, responses=STEERED, parameters=[idempotency.PARAMETER],
                   description="Go back to a kept checkpoint (by `checkpoint` id or the newest "
                   "at or before `step`), optionally skipping the data window since then.")
    @action(detail=True, methods=["post"])
    @idempotent
    def rollback(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.ROLLBACK, RollbackBody)

    @extend_schema(request=ReshardBody, responses=STEERED, parameters=[idempotency.PARAMETER],
                   description="Checkpoint and relaunch the ranks on another layout; the "
                   "global batch stays the same.")
    @action(detail=True, methods=["post"])
    @idempotent
    def reshard(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.RESHARD, ReshardBody)

    @extend_schema(request=CommandBody, responses=STEERED, parameters=[idempotency.PARAMETER],
                   description="Write a checkpoint at the next step boundary.")
    @action(detail=True, methods=["post"])
    @idempotent
    def checkpoint(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.CHECKPOINT, CommandBody)

    @extend_schema(request=OpenApiTypes.OBJECT, responses=STEERED,
                   parameters=[idempotency.PARAMETER],
                   description="Change live settings at the next step boundary: a flat object of "
                   "dotted spec keys (engine.runtime.spec.SETTABLE). A bad key or value "
                   "answers 400 naming it, and nothing is sent.",
                   examples=[OpenApiExample("lr", value={"train.lr": 0.001,
                                                         "checkpoint.every": 20})])
    @action(detail=True, methods=["post"])
    @idempotent
    def set(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.SET, SetBody)

    @extend_schema(request=RebalanceBody, responses=STEERED, parameters=[idempotency.PARAMETER],
                   description="Set the data-parallel ranks' shares of each step's global batch "
                   "from the next step on: follow their measured speeds (`auto`, what the "
                   "fault policy does for a straggler), go back to even, or pin a list of "
                   "samples per rank. The update stays the balanced run's on the same samples.",
                   examples=[OpenApiExample("pinned", value={"shares": [10, 10, 10, 2]}),
                             OpenApiExample("auto", value={"shares": "auto"})])
    @action(detail=True, methods=["post"])
    @idempotent
    def rebalance(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.REBALANCE, RebalanceBody)

    @extend_schema(responses={200: ProposalSerializer(many=True), **ERRORS}, filters=False,
                   description="The fault policy's proposals (`faults.policy.approve`), oldest "
                   "first (paginated), each as its latest `proposal` event says: `pending` "
                   "with the anomaly's `evidence`, its `deadline` and `default`, or decided "
                   "with `take` and `by`.")
    @action(detail=True, methods=["get"], url_path="proposals", url_name="proposals")
    def proposal_list(self, request: Request, pk: str) -> Response:
        return self._page(proposals.proposals(self.get_object()), ProposalSerializer)

    @extend_schema(request=DecideBody, parameters=[idempotency.PARAMETER],
                   responses={**STEERED, 409: OpenApiResponse(
                       DETAIL, description="the job's state does not allow it, or the "
                       "proposal is no longer pending (`detail` says what became of it)")},
                   description="Answer a pending proposal: approve it, choose another action, "
                   "or dismiss it. The engine carries the answer out on the step it holds at "
                   "(or, training on, at its next step); audited.")
    @action(detail=True, methods=["post"], url_name="proposal-decide",
            url_path=r"proposals/(?P<proposal_id>[A-Za-z0-9_.-]+)/decide")
    @idempotent
    def decide(self, request: Request, pk: str, proposal_id: str) -> Response:
        proposal = proposals.find(self.get_object(), proposal_id)
        if proposal is None:
            raise NotFound(f"no proposal {proposal_id} of this job")
        if proposal["status"] != ProposalStatus.PENDING:
            raise ProposalDecided(proposal)
        return self._steer(request, CommandKind.DECIDE, DecideBody, proposal=proposal_id)

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **ERRORS}, filters=False,
                   description="The live settings: `effective` values (the spec's, with the "
                   "`set` commands the engine carried out over them) and their `history`, "
                   "`[{step, changes: {key: {old, new}}, by}]`, from the stored action events.")
    @action(detail=True, methods=["get"], url_path="settings", url_name="settings")
    def live_settings(self, request: Request, pk: str) -> Response:
        return Response(settings_history(self.get_object()))

    def _page(self, rows, serializer_class) -> Response:
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(serializer_class(page, many=True).data)

    @extend_schema(responses={200: CheckpointSerializer(many=True), **ERRORS},
                   filters=False)
    @action(detail=True, methods=["get"])
    def checkpoints(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        page = self.paginate_queryset(Checkpoint.objects.filter(job=job)
                                      .select_related("export").order_by("seq"))
        # each row's branch: the job's rollbacks, read once for the page
        rows = CheckpointSerializer(page, many=True, context={"rollbacks": job_rollbacks(job.pk)})
        return self.get_paginated_response(rows.data)

    @extend_schema(responses={200: ExportSerializer, **ERRORS},
                   description="The export of this checkpoint: its state, folder and error "
                   "(404 until it is exported).")
    @action(detail=True, methods=["get"], url_name="checkpoint-export",
            url_path=r"checkpoints/(?P<checkpoint_id>[0-9]+)/export")
    def export(self, request: Request, pk: str, checkpoint_id: str) -> Response:
        job = self.get_object()
        found = Export.objects.filter(checkpoint__job=job, checkpoint=checkpoint_id).first()
        if found is None:
            raise NotFound(f"checkpoint {checkpoint_id} of job {job.pk} was not exported")
        return Response(ExportSerializer(found).data)

    @extend_schema(request=None, parameters=[idempotency.PARAMETER],
                   responses={202: ExportSerializer, **EXPORT_ERRORS},
                   description="Export a disk checkpoint as a Hugging Face model folder, on a "
                   "worker, into <RUNS_DIR>/<job id>/exports/<checkpoint name>/; 202 with the "
                   "export (pending), which GET follows. A memory-tier checkpoint or one "
                   "retention deleted answers 409 with the reason.")
    @export.mapping.post
    @idempotent
    def start_export(self, request: Request, pk: str, checkpoint_id: str) -> Response:
        job = self.get_object()
        try:
            started = exports.start(exports.disk_checkpoint(job, int(checkpoint_id)))
        except exports.CheckpointRefused as refused:
            return Response({"detail": str(refused)}, status=refused.status)
        return Response(ExportSerializer(started).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: EvaluationSerializer(many=True), **ERRORS}, filters=False,
                   description="This checkpoint's evaluations, oldest first: state, items "
                   "scored, results (held-out loss and perplexity per source, task scores, "
                   "generations) and error.")
    @action(detail=True, methods=["get"], url_name="checkpoint-evaluate",
            url_path=r"checkpoints/(?P<checkpoint_id>[0-9]+)/evaluate")
    def evaluate(self, request: Request, pk: str, checkpoint_id: str) -> Response:
        job = self.get_object()
        if not Checkpoint.objects.filter(job=job, pk=checkpoint_id).exists():
            raise NotFound(f"job {job.pk} has no checkpoint {checkpoint_id}")
        return self._page(Evaluation.objects.filter(checkpoint=checkpoint_id),
                          EvaluationSerializer)

    @extend_schema(request=evaluations.EvaluateBody, parameters=[idempotency.PARAMETER],
                   responses={202: EvaluationSerializer, **EXPORT_ERRORS},
                   description="Evaluate a disk checkpoint on a worker: held-out loss and "
                   "perplexity per source, and the task file's items; 202 with the evaluation "
                   "(pending), which GET lists. A memory-tier checkpoint or one retention "
                   "deleted answers 409 with the reason.")
    @evaluate.mapping.post
    @idempotent
    def start_evaluation(self, request: Request, pk: str, checkpoint_id: str) -> Response:
        job = self.get_object()
        body = evaluations.EvaluateBody(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        try:
            checkpoint = exports.disk_checkpoint(job, int(checkpoint_id), "evaluate")
        except exports.CheckpointRefused as refused:
            return Response({"detail": str(refused)}, status=refused.status)
        started = evaluations.start(checkpoint, **body.validated_data)
        return Response(EvaluationSerializer(started).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: JobEventSerializer(many=True), **ERRORS}, filters=False,
                   description="The job's state history (JobEvents), oldest first.")
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str) -> Response:
        return self._page(self.get_object().transitions.all(), JobEventSerializer)

    @extend_schema(responses={200: AnomalySerializer(many=True), **ERRORS}, filters=False)
    @action(detail=True, methods=["get"])
    def anomalies(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        return self._page(Anomaly.objects.filter(job=job).order_by("seq"), AnomalySerializer)

    @extend_schema(responses={200: CommandSerializer(many=True), **ERRORS}, filters=False)
    @action(detail=True, methods=["get"])
    def commands(self, request: Request, pk: str) -> Response:
        return self._page(self.get_object().commands.all(), CommandSerializer)

    @extend_schema(request=CloneBody, parameters=[idempotency.PARAMETER],
                   responses={201: JobDetailSerializer, **STEER_ERRORS, 429: QUOTA_REACHED},
                   description="A new job from this one's spec (and platform policy), "
                   "optionally starting from one of its disk checkpoints.")
    @action(detail=True, methods=["post"])
    @idempotent
    def clone(self, request: Request, pk: str) -> Response:
        original = self.get_object()
        body = CloneBody(data=request.data if isinstance(request.data, dict) else {},
                         context={"job": original})
        body.is_valid(raise_exception=True)
        errors: dict[str, str] = {}  # what the clone may read is its caller's, checked again
        spec = confinement.confine({**original.spec, "name": body.validated_data["name"]},
                                   request.user, errors)
        if errors:
            return Response({"errors": errors}, status=status.HTTP_400_BAD_REQUEST)
        admission.admit(request.user, spec)
        job = self._launch(request, spec, PlatformPolicy.parse(original.platform or None),
                           "job.clone", resume_from=body.validated_data["resume_from"],
                           priority=admission.capped_priority(request.user, original.priority),
                           sinks=[sink.config for sink in original.sinks.all()],
                           backend=(original.backend, original.backend_options),
                           original=original.pk)
        return Response(JobDetailSerializer(job).data, status=status.HTTP_201_CREATED)

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


def settings_history(job: Job) -> dict:
    """Replays the job's `set` actions over its spec. A rollback that restored a checkpoint's
    settings drops the changes made at or after that checkpoint's step (a checkpoint is saved
    before the step's commands are carried out) and enters the history as "rollback"."""
    launched = launched_values(parse_spec(job.spec))
    by = {str(pk): user for pk, user in
          job.commands.filter(kind=CommandKind.SET).values_list("pk", "requested_by")}
    history: list[dict] = []
    in_force: list[dict] = []  # the set entries in force, oldest first
    effective = launched
    for row in Action.objects.filter(job=job, action__in=("set", "rollback")).order_by("seq"):
        if row.action == "set":
            entry = {"step": row.step, "changes": row.details.get("changes", {}),
                     "by": by.get(row.command, row.by)}
            in_force.append(entry)
        elif row.details.get("settings") == "restored":
            to_step = int(row.details.get("to_step", 0))
            in_force = [e for e in in_force if e["step"] < to_step]
            entry = {"step": row.step, "changes": {}, "by": "rollback"}
        else:
            continue
        now = {**launched, **{k: c["new"] for e in in_force for k, c in e["changes"].items()}}
        if entry["by"] == "rollback":
            entry["changes"] = {k: {"old": effective[k], "new": v} for k, v in now.items()
                                if v != effective[k]}
        effective = now
        history.append(entry)
    return {"effective": effective, "history": history}


class CommandRulesView(APIView):
    """Each command's rule: the job states it may be issued in, and the state it moves the job
    to. The job page enables its controls by these."""

    @extend_schema(responses={200: CommandRulesSerializer, 401: UNAUTHENTICATED})
    def get(self, request: Request) -> Response:
        return Response(CommandRulesSerializer(COMMAND_RULES).data)


class PlanView(APIView):
    """PaRO planner predictions: every strategy's memory and step time for a model and a
    layout, best first (those that fit, fastest first; then the rest by memory)."""

    @extend_schema(parameters=[PlanQuery], responses={200: PlanSerializer, 400: BAD_QUERY,
                                                      401: UNAUTHENTICATED})
    def get(self, request: Request) -> Response:
        query = PlanQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        spec, budget = query.validated_data["spec"], query.validated_data["memory_budget_gb"] * 1e9
        rows, compute, priced = calibration.predict(spec, budget, DEFAULT_LINKS)
        t = spec.train
        tokens = t.micro_batch * t.seq_len * t.grad_accum * spec.parallel.world_size
        known = compute.time_s is not None
        return Response(PlanSerializer({
            "memory_budget_bytes": budget, "refused": admission.memory_refusal(spec), "plans": [
            {"strategy": r.strategy, "names": r.names, "fits": r.fits,
             "step_time_s": r.step_time_s if known else None,
             "compute_time_s": r.compute_time_s if known else None,
             "comm_time_s": r.comm_time_s,
             "tokens_per_s": tokens / r.step_time_s if known else None,
             "compute_source": compute.source, "link_source": priced.source,
             "memory_bytes": {"params": r.params_bytes, "grads": r.grads_bytes,
                              "optim": r.optim_bytes, "total": r.memory_bytes}}
            for r in rows]}).data)


class TokenView(APIView):
    """Exchange a username and password for a new API token (the user's `default` token; the
    previous `default` is revoked: see ApiToken.exchange). Throttled per client address and
    per account (jobs.login)."""

    permission_classes = [AllowAny]
    authentication_classes: list = []
    throttle_classes = [LoginAddressThrottle, LoginAccountThrottle]

    @extend_schema(
        request=AuthTokenSerializer,
        responses={200: inline_serializer("TokenResponse", {"token": serializers.CharField()}),
                   400: FIELD_ERRORS, 429: DETAIL},
    )
    def post(self, request: Request) -> Response:
        credentials = AuthTokenSerializer(data=request.data, context={"request": request})
        credentials.is_valid(raise_exception=True)
        user = credentials.validated_data["user"]
        token = ApiToken.exchange(user)
        audit("token.create", user.get_username(), "user", user=user, name=token.name,
              token=token.pk)
        return Response({"token": token.key})


@extend_schema_view(
    list=extend_schema(responses={200: ApiTokenSerializer(many=True), 401: UNAUTHENTICATED}),
    create=extend_schema(request=ApiTokenSerializer, responses={
        201: NewApiTokenSerializer, 400: FIELD_ERRORS, 401: UNAUTHENTICATED, 429: DETAIL},
        description="A new named token; its key is shown in this answer only."),
    destroy=extend_schema(responses={204: None, **ERRORS},
                          description="Revoke the token (it stays listed, with `revoked`)."),
)
class ApiTokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin,
                      viewsets.GenericViewSet):
    """Your named API tokens."""

    serializer_class = ApiTokenSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return ApiToken.objects.filter(user=self.request.user)

    def create(self, request: Request) -> Response:
        body = ApiTokenSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        wait = token_creation_wait(request.user)
        if wait is not None:
            raise Throttled(wait, "too many new tokens this hour")
        token = body.save(user=request.user)
        audit("token.create", actor(request), request_cause(request), user=request.user,
              name=token.name, token=token.pk)
        return Response(NewApiTokenSerializer(token).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, token: ApiToken) -> None:
        token.revoke()
        audit("token.revoke", actor(self.request), request_cause(self.request),
              user=self.request.user, name=token.name, token=token.pk)


@extend_schema_view(
    list=extend_schema(responses={200: WebhookSerializer(many=True), 401: UNAUTHENTICATED}),
    create=extend_schema(request=WebhookSerializer, responses={
        201: NewWebhookSerializer, 400: FIELD_ERRORS, 401: UNAUTHENTICATED, 429: DETAIL},
        description="Notifications for one of your jobs (`job`) or all of them: a signed JSON "
        "POST per event (`anomaly`, `policy.pause`, `policy.resume`, `job.paused`, "
        "`job.completed`, `job.failed`, `job.cancelled`). Header `X-Ringside-Signature: "
        "sha256=<HMAC-SHA256 of the body under the secret>`; the secret is in this answer only. "
        "`url`: http(s) to a public address (no loopback, private, link-local, multicast or "
        "reserved one, unless the operator allows it); checked again at each delivery, and "
        "redirects are not followed. A delivery is retried with backoff while the receiver is "
        "unreachable or answers 5xx; `last_status`: `delivered`, `refused by the receiver "
        "(HTTP <code>)`, `unreachable`, or `refused: not a public address` (the host resolved "
        "to one at delivery: nothing was sent). 429: at most RINGSIDE_WEBHOOKS_PER_USER "
        "webhooks per user."),
    destroy=extend_schema(responses={204: None, **ERRORS}),
)
class WebhookViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin,
                     viewsets.GenericViewSet):
    """Your webhooks."""

    serializer_class = WebhookSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Webhook.objects.none()
        return Webhook.objects.filter(owner=self.request.user)

    def create(self, request: Request) -> Response:
        body = WebhookSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        with transaction.atomic():
            if not Webhook.room_for(request.user):
                raise Throttled(detail=f"at most {settings.RINGSIDE_WEBHOOKS_PER_USER} webhooks "
                                "per user: delete one to add another")
            hook = body.save(owner=request.user)
        # the entry belongs to the hook's job, when it has one (and so to the job's owner)
        audit("webhook.create", actor(request), request_cause(request), user=request.user,
              job=hook.job, url=hook.url)
        return Response(NewWebhookSerializer(hook).data, status=status.HTTP_201_CREATED)


class AuditView(generics.ListAPIView):
    """Control actions, newest first: job launches and steering, token and webhook changes.
    Yours (on your jobs and your account); staff see everyone's."""

    serializer_class = AuditEntrySerializer

    @extend_schema(responses={200: AuditEntrySerializer(many=True), 401: UNAUTHENTICATED})
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return AuditEntry.objects.none()
        entries = AuditEntry.objects.all()
        return entries if self.request.user.is_staff else entries.filter(user=self.request.user)

