"""REST API: jobs (create, read, steer, clone, their checkpoints' exports and evaluations) and
the command rules. A job's telemetry reads (metrics, goodput, anomalies, ops, ...) are
monitor.api's, routed under the same `jobs/<id>/` (monitor.urls); the planner is
jobs.plan_api's; API tokens, webhooks and the audit log are jobs.access_api's.

Views stay thin: bodies are validated by serializers (jobs.serializers, jobs.bodies), state
moves are Job methods, commands go through jobs.commands. Every POST takes an
`Idempotency-Key` (jobs.idempotency).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound
from rest_framework.filters import OrderingFilter
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.parsers import BoundedJSONParser
from engine.contract import COMMAND_RULES, CommandKind, ProposalStatus
from jobs import (
    admission,
    confinement,
    evaluations,
    exports,
    history,
    idempotency,
    proposals,
)
from jobs.bodies import (
    CloneBody,
    CommandBody,
    DecideBody,
    PauseBody,
    RebalanceBody,
    ReshardBody,
    RollbackBody,
    SetBody,
)
from jobs.commands import issue
from jobs.errors import (
    BAD_BODY,
    BAD_QUERY,
    CREATE_ERRORS,
    DETAIL,
    ERRORS,
    STEER_ERRORS,
    UNAUTHENTICATED,
)
from jobs.idempotency import idempotent
from jobs.mixtures import mixtures
from jobs.models import Checkpoint, Evaluation, Export, IllegalTransition, Job, State
from jobs.permissions import audit, request_cause, visible_jobs
from jobs.policy import PlatformPolicy
from jobs.serializers import (
    CheckpointSerializer,
    CommandRulesSerializer,
    CommandSerializer,
    EvaluationSerializer,
    ExportSerializer,
    JobCreateSerializer,
    JobDetailSerializer,
    JobEventSerializer,
    JobNoteSerializer,
    JobSerializer,
    ProposalSerializer,
)
from jobs.telemetry import telemetry


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


def steering(description: str, **schema: Any) -> Callable[[Callable], Callable]:
    """What a steering action shares, above its @action: its schema (a 202 with the command,
    or why not) and its Idempotency-Key."""
    def decorate(handler: Callable) -> Callable:
        return extend_schema(**{"responses": STEERED, "parameters": [idempotency.PARAMETER],
                                "description": description, **schema})(idempotent(handler))
    return decorate


def checkpoint_route(name: str) -> Callable[[Callable], Callable]:
    """GET (and, by its `.mapping`, POST) /api/jobs/<id>/checkpoints/<checkpoint_id>/<name>/:
    what is made from one of the job's checkpoints (its export, its evaluations)."""
    return action(detail=True, methods=["get"], url_name=f"checkpoint-{name}",
                  url_path=rf"checkpoints/(?P<checkpoint_id>[0-9]+)/{name}")


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

    serializer_class = JobSerializer  # the list's; each action with a body names its own
    action_serializers = {"create": JobCreateSerializer, "retrieve": JobDetailSerializer,
                          "partial_update": JobNoteSerializer}

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user
            return Job.objects.none()
        # one query for every listed job's placement (Job.placement reads the prefetch)
        return visible_jobs(self.request.user).prefetch_related("reservations__host")

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return self.action_serializers.get(self.action, self.serializer_class)

    def get_serializer_context(self) -> dict[str, Any]:
        # an action's body is checked against its job (a rollback's checkpoint, a reshard's
        # layout, a clone's checkpoint) and a decision's against its proposal, named by the URL
        context = super().get_serializer_context()
        if self.detail and self.request.method == "POST":
            context["job"] = self.get_object()
            context["proposal"] = self.kwargs.get("proposal_id")
        return context

    def get_object(self) -> Job:
        # once per request: an action and its body's context both read it
        if not hasattr(self, "_job"):
            self._job = super().get_object()
        return self._job

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
        body = self.get_serializer(data=request.data)
        if not body.is_valid():
            return Response({"errors": body.errors}, status=status.HTTP_400_BAD_REQUEST)
        admission.admit(request.user, body.validated_data["spec"],
                        body.validated_data["priority"])
        job = self._launch(request, "job.create", **body.validated_data)
        return Response(JobDetailSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=JobNoteSerializer,
                   responses={200: JobDetailSerializer, 400: BAD_BODY, **ERRORS},
                   description="Change the job's `tags` and `note`, nothing else; audited.")
    def partial_update(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        body = self.get_serializer(job, data=request.data, partial=True)
        if not isinstance(request.data, dict) or set(request.data) - set(body.fields):
            return Response({"non_field_errors": ["only `tags` and `note` can be changed"]},
                            status=status.HTTP_400_BAD_REQUEST)
        body.is_valid(raise_exception=True)
        body.save()
        audit(request, "job.annotate", job=job, **body.validated_data)
        return Response(JobDetailSerializer(job).data)

    def _launch(self, request: Request, what: str, spec: dict, policy: PlatformPolicy,
                resume_from: str = "", priority: int = 0,
                sinks: list[dict[str, str]] | None = None,
                backend: tuple[str, dict] = (settings.BACKEND, {}), **details) -> Job:
        from jobs.tasks import dispatch

        with transaction.atomic():
            job = Job.objects.create(name=spec["name"], owner=request.user, spec=spec,
                                     platform=policy.to_dict(), resume_from=resume_from,
                                     priority=priority, backend=backend[0],
                                     backend_options=backend[1])
            telemetry().attach_sinks(job, sinks)
            mixtures().record_use(job)
            audit(request, what, job=job, **details)
            dispatch(job)
        return job

    def _steer(self, request: Request, kind: CommandKind) -> Response:
        """Validate the action's body, issue the command, answer 202 with it (409 when the
        job's state does not allow it)."""
        body: CommandBody = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            command = issue(self.get_object(), kind, dict(body.validated_data),
                            engine_args=body.engine_args(), actor=request.user.get_username(),
                            cause=request_cause(request))
        except IllegalTransition as e:
            raise Conflict(e) from e
        return Response(CommandSerializer(command).data, status=status.HTTP_202_ACCEPTED)

    @steering("Cold (default): checkpoint at the next step boundary and stop, freeing the "
              "worker (running → pausing → paused). `{\"mode\": \"warm\"}`: the ranks idle at "
              "the step boundary with their state in memory, holding the worker, until a "
              "resume (or `max_s`, then it turns cold).")
    @action(detail=True, methods=["post"], serializer_class=PauseBody)
    def pause(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.PAUSE)

    @steering("Queue a paused job again; it continues from its newest checkpoint.")
    @action(detail=True, methods=["post"], serializer_class=CommandBody)
    def resume(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.RESUME)

    @steering("Queued and paused jobs are cancelled at once; a running one stops at its next "
              "step boundary (or by signal within seconds).")
    @action(detail=True, methods=["post"], serializer_class=CommandBody)
    def cancel(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.CANCEL)

    @steering("Go back to a kept checkpoint (by `checkpoint` id or the newest at or before "
              "`step`), optionally skipping the data window since then.")
    @action(detail=True, methods=["post"], serializer_class=RollbackBody)
    def rollback(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.ROLLBACK)

    @steering("Checkpoint and relaunch the ranks on another layout; the global batch stays "
              "the same.")
    @action(detail=True, methods=["post"], serializer_class=ReshardBody)
    def reshard(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.RESHARD)

    @steering("Write a checkpoint at the next step boundary.")
    @action(detail=True, methods=["post"], serializer_class=CommandBody)
    def checkpoint(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.CHECKPOINT)

    @steering("Change live settings at the next step boundary: a flat object of dotted spec "
              "keys (engine.runtime.spec.SETTABLE). A bad key or value answers 400 naming "
              "it, and nothing is sent.", request=OpenApiTypes.OBJECT,
              examples=[OpenApiExample("lr", value={"train.lr": 0.001, "checkpoint.every": 20})])
    @action(detail=True, methods=["post"], serializer_class=SetBody)
    def set(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.SET)

    @steering("Set the data-parallel ranks' shares of each step's global batch from the next "
              "step on: follow their measured speeds (`auto`, what the fault policy does for a "
              "straggler), go back to even, or pin a list of samples per rank. The update "
              "stays the balanced run's on the same samples.",
              examples=[OpenApiExample("pinned", value={"shares": [10, 10, 10, 2]}),
                        OpenApiExample("auto", value={"shares": "auto"})])
    @action(detail=True, methods=["post"], serializer_class=RebalanceBody)
    def rebalance(self, request: Request, pk: str) -> Response:
        return self._steer(request, CommandKind.REBALANCE)

    @extend_schema(responses={200: ProposalSerializer(many=True), **ERRORS}, filters=False,
                   description="The fault policy's proposals (`faults.policy.approve`), oldest "
                   "first (paginated), each as its latest `proposal` event says: `pending` "
                   "with the anomaly's `evidence`, its `deadline` and `default`, or decided "
                   "with `take` and `by`.")
    @action(detail=True, methods=["get"], url_path="proposals", url_name="proposals")
    def proposal_list(self, request: Request, pk: str) -> Response:
        return self._page(proposals.proposals(self.get_object()), ProposalSerializer)

    @steering("Answer a pending proposal: approve it, choose another action, or dismiss it. "
              "The engine carries the answer out on the step it holds at (or, training on, at "
              "its next step); audited.", responses={**STEERED, 409: OpenApiResponse(
                  DETAIL, description="the job's state does not allow it, or the proposal is "
                  "no longer pending (`detail` says what became of it)")})
    @action(detail=True, methods=["post"], serializer_class=DecideBody,
            url_name="proposal-decide",
            url_path=r"proposals/(?P<proposal_id>[A-Za-z0-9_.-]+)/decide")
    def decide(self, request: Request, pk: str, proposal_id: str) -> Response:
        proposal = proposals.find(self.get_object(), proposal_id)
        if proposal is None:
            raise NotFound(f"no proposal {proposal_id} of this job")
        if proposal["status"] != ProposalStatus.PENDING:
            raise ProposalDecided(proposal)
        return self._steer(request, CommandKind.DECIDE)

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **ERRORS}, filters=False,
                   description="The live settings: `effective` values (the spec's, with the "
                   "`set` commands the engine carried out over them) and their `history`, "
                   "`[{step, changes: {key: {old, new}}, by}]`, from the stored action events.")
    @action(detail=True, methods=["get"], url_path="settings", url_name="settings")
    def live_settings(self, request: Request, pk: str) -> Response:
        return Response(history.settings_history(self.get_object()))

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
        rows = CheckpointSerializer(page, many=True,
                                    context={"rollbacks": history.rollbacks(job.pk)})
        return self.get_paginated_response(rows.data)

    @extend_schema(responses={200: ExportSerializer, **ERRORS},
                   description="The export of this checkpoint: its state, folder and error "
                   "(404 until it is exported).")
    @checkpoint_route("export")
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
    @checkpoint_route("evaluate")
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

    @extend_schema(responses={200: CommandSerializer(many=True), **ERRORS}, filters=False)
    @action(detail=True, methods=["get"])
    def commands(self, request: Request, pk: str) -> Response:
        return self._page(self.get_object().commands.all(), CommandSerializer)

    @extend_schema(parameters=[idempotency.PARAMETER],
                   responses={201: JobDetailSerializer, **STEER_ERRORS, 429: QUOTA_REACHED},
                   description="A new job from this one's spec (and platform policy), "
                   "optionally starting from one of its disk checkpoints.")
    @action(detail=True, methods=["post"], serializer_class=CloneBody)
    @idempotent
    def clone(self, request: Request, pk: str) -> Response:
        original = self.get_object()
        body = self.get_serializer(data=request.data if isinstance(request.data, dict) else {})
        body.is_valid(raise_exception=True)
        errors: dict[str, str] = {}  # what the clone may read is its caller's, checked again
        spec = confinement.confine({**original.spec, "name": body.validated_data["name"]},
                                   request.user, errors)
        if errors:
            return Response({"errors": errors}, status=status.HTTP_400_BAD_REQUEST)
        admission.admit(request.user, spec)
        job = self._launch(request, "job.clone", spec,
                           PlatformPolicy.parse(original.platform or None),
                           resume_from=body.validated_data["resume_from"],
                           priority=admission.capped_priority(request.user, original.priority),
                           sinks=[sink.config for sink in original.sinks.all()],
                           backend=(original.backend, original.backend_options),
                           original=original.pk)
        return Response(JobDetailSerializer(job).data, status=status.HTTP_201_CREATED)


class CommandRulesView(APIView):
    """Each command's rule: the job states it may be issued in, and the state it moves the job
    to. The job page enables its controls by these."""

    @extend_schema(responses={200: CommandRulesSerializer, 401: UNAUTHENTICATED})
    def get(self, request: Request) -> Response:
        return Response(CommandRulesSerializer(COMMAND_RULES).data)
