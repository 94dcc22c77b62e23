"""REST API for jobs: list, create (validated by the engine's own spec parser), detail,
cancel, and the stored metric series."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authtoken.models import Token
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.response import Response

from engine.runtime.spec import SpecError, parse_spec
from jobs.models import Cause, IllegalTransition, Job
from jobs.serializers import JobDetailSerializer, JobSerializer
from monitor.series import job_series


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"

    def __init__(self, error: IllegalTransition):
        super().__init__({"detail": str(error), "state": error.state})


def request_cause(request: Request) -> str:
    """API token or a person's session: the JobEvent cause of what this request does."""
    return Cause.API_TOKEN if isinstance(request.auth, Token) else Cause.USER


SPEC_ERRORS = inline_serializer(
    "SpecErrors", {"errors": serializers.DictField(child=serializers.CharField())}
)
SERIES = inline_serializer(
    "MetricSeries",
    {"series": serializers.DictField(
        child=serializers.DictField(child=serializers.ListField()),
        help_text='{name: {"step": [...], "value": [...]}}; value is null for NaN/inf')},
)


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Your jobs (staff: everyone's). Another user's job answers 404."""

    def get_queryset(self):
        jobs = Job.objects.select_related("owner")
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user
            return jobs.none()
        if self.request.user.is_staff:
            return jobs
        return jobs.filter(owner=self.request.user)

    def get_serializer_class(self):
        return JobDetailSerializer if self.action == "retrieve" else JobSerializer

    @extend_schema(
        request=OpenApiTypes.OBJECT,
        responses={201: JobDetailSerializer, 400: OpenApiResponse(SPEC_ERRORS)},
        description="Body: the job spec itself (DESIGN.md §3). An invalid spec answers 400 with "
        "`errors`, a map from each bad field's dotted path to a message.",
        examples=[OpenApiExample("nano", value={
            "name": "demo", "model": {"preset": "nano"}, "train": {"steps": 20}})],
    )
    def create(self, request: Request) -> Response:
        try:
            spec = parse_spec(request.data).to_dict()
        except SpecError as e:
            return Response({"errors": e.errors}, status=status.HTTP_400_BAD_REQUEST)
        from jobs.tasks import run_job

        with transaction.atomic():
            job = Job.objects.create(name=spec["name"], owner=request.user, spec=spec)
            transaction.on_commit(lambda: run_job.delay(job.pk))
        return Response(JobDetailSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: JobDetailSerializer, 409: OpenApiTypes.OBJECT},
                   description="Queued jobs are cancelled at once; running ones are stopped by "
                   "their supervisor within seconds. 409 names the state of a finished job.")
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        try:
            job.request_cancel(request_cause(request), request.user.get_username())
        except IllegalTransition as e:
            raise Conflict(e) from e
        return Response(JobDetailSerializer(job).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: SERIES})
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        return Response({"series": job_series(job.pk)})


class TokenView(ObtainAuthToken):
    """Exchange a username and password for the user's API token."""

    @extend_schema(
        request=inline_serializer("TokenRequest", {"username": serializers.CharField(),
                                                   "password": serializers.CharField()}),
        responses={200: inline_serializer("TokenResponse", {"token": serializers.CharField()})},
    )
    def post(self, request: Request, *args, **kwargs) -> Response:
        return super().post(request, *args, **kwargs)
