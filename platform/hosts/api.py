"""REST API of the host registry: `/api/hosts/` (every host, with the slots its jobs hold),
`/api/hosts/<name>/`, and, for staff, `/api/hosts/<name>/drain/` and `/undrain/`."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAdminUser, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from hosts import live, registry, status
from hosts.models import Host

STATES = ("up", "lost", "drained")


class HoldingSerializer(serializers.Serializer):
    job = serializers.IntegerField(allow_null=True, help_text=(
        "the job's id; null: another user's job (only staff see whose)"))
    name = serializers.CharField(help_text='the job\'s name, or "a job of another user"')
    node_rank = serializers.IntegerField(help_text="0: the job's lead host")
    slots = serializers.ListField(child=serializers.IntegerField(), help_text="slot indices")


class HostSerializer(serializers.Serializer):
    name = serializers.CharField()
    address = serializers.CharField(help_text="where its peers reach it")
    devices = serializers.JSONField(help_text='{"cpu": {"cores", "memory_bytes"}, '
                                              '"gpus": [{"name", "memory_bytes"}]}')
    labels = serializers.DictField(child=serializers.CharField())
    slots = serializers.IntegerField()
    slots_used = serializers.IntegerField(help_text="held by jobs' reservations")
    slots_free = serializers.IntegerField()
    state = serializers.ChoiceField(STATES, help_text="lost: no beat for HOST_LOST_AFTER_S; "
                                                      "drained: takes no new placements")
    drained = serializers.BooleanField()
    beat_at = serializers.DateTimeField(help_text="its last beat, on the database's clock")
    started_at = serializers.DateTimeField(help_text="when its worker registered")
    beat_age_s = serializers.FloatField()
    version = serializers.CharField()
    version_differs = serializers.BooleanField(help_text="it runs other code than this server")
    clock_offset_s = serializers.FloatField(help_text="its clock minus the database's, at its "
                                                      "last beat (shown, never trusted)")
    jobs = HoldingSerializer(many=True, help_text="the jobs holding its slots")


NOT_STAFF = OpenApiResponse(description="not staff")
NO_SUCH_HOST = OpenApiResponse(description="no host by that name")


@extend_schema_view(
    list=extend_schema(description="Every registered host, lost ones included, by name."),
    retrieve=extend_schema(description="One host by name.",
                           responses={200: HostSerializer, 404: NO_SUCH_HOST}),
)
class HostViewSet(viewsets.GenericViewSet):
    serializer_class = HostSerializer
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    pagination_class = None  # a cluster's hosts fit in one answer

    def get_queryset(self):
        return status.with_holdings(Host.objects.all())

    def get_permissions(self):
        staff = self.action in ("drain", "undrain")
        return [IsAuthenticated(), *([IsAdminUser()] if staff else [])]

    def list(self, request: Request) -> Response:
        hosts = status.records(self.get_queryset(), request.user)
        return Response(HostSerializer(hosts, many=True).data)

    def retrieve(self, request: Request, name: str) -> Response:
        return Response(HostSerializer(status.record(self.get_object(), request.user)).data)

    @extend_schema(request=None, responses={200: HostSerializer, 403: NOT_STAFF,
                                                    404: NO_SUCH_HOST},
                   description="Staff: no new placements on the host; its running jobs "
                               "move off at their next checkpoint.")
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, name: str) -> Response:
        return self._set_drained(request, True)

    @extend_schema(request=None, responses={200: HostSerializer, 403: NOT_STAFF,
                                                    404: NO_SUCH_HOST},
                   description="Staff: the host takes placements again.")
    @action(detail=True, methods=["post"])
    def undrain(self, request: Request, name: str) -> Response:
        return self._set_drained(request, False)

    def _set_drained(self, request: Request, drained: bool) -> Response:
        host = registry.set_drained(self.get_object(), drained, request.user.get_username())
        live.publish(host.name)
        return Response(HostSerializer(status.record(host, request.user)).data)
