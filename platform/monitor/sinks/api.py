"""REST API of the sinks: a job's sinks as its detail shows them, the user's default sinks
(`/api/me/sinks/`) and tracker tokens (`/api/me/secrets/`: set or delete; a listing says which
are set and when, never a value)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.errors import BAD_BODY, FIELD_ERRORS, UNAUTHENTICATED
from monitor.sinks import options, secrets
from monitor.sinks.models import Secret, SecretName, Sink, SinkDefaults

SECRET_MAX_CHARS = 4096
SECRET_NAME = OpenApiParameter("name", OpenApiTypes.STR, OpenApiParameter.PATH,
                               enum=SecretName.values, description="which token")


class SinkSerializer(serializers.ModelSerializer):
    class Meta:
        model = Sink
        fields = ["kind", "config", "state", "last_seq", "last_error", "run_id", "updated"]
        read_only_fields = fields


class SinkListBody(serializers.Serializer):
    sinks = serializers.JSONField(help_text='e.g. ["tensorboard", {"kind": "wandb", "mode": '
                                  '"offline", "project": "moe"}] (monitor.sinks.options)')

    def validate(self, data: dict) -> dict:
        try:
            return {"sinks": options.parse(data["sinks"])}
        except options.SinkError as e:
            raise serializers.ValidationError(e.errors) from e


class SecretSerializer(serializers.ModelSerializer):
    class Meta:
        model = Secret
        fields = ["name", "updated"]
        read_only_fields = fields


class SecretBody(serializers.Serializer):
    value = serializers.CharField(max_length=SECRET_MAX_CHARS, trim_whitespace=True,
                                  write_only=True)


class SinkDefaultsView(APIView):
    """The sinks your new jobs get when their body names none."""

    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: SinkListBody, 401: UNAUTHENTICATED})
    def get(self, request: Request) -> Response:
        return Response({"sinks": options.defaults_of(request.user.pk)})

    @extend_schema(request=SinkListBody,
                   responses={200: SinkListBody, 400: BAD_BODY, 401: UNAUTHENTICATED})
    def put(self, request: Request) -> Response:
        body = SinkListBody(data=request.data)
        body.is_valid(raise_exception=True)
        SinkDefaults.objects.update_or_create(owner=request.user,
                                              defaults={"sinks": body.validated_data["sinks"]})
        return Response(body.validated_data)


class SecretListView(APIView):
    """Which of your tracker tokens are set (never their values)."""

    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: SecretSerializer(many=True), 401: UNAUTHENTICATED})
    def get(self, request: Request) -> Response:
        return Response(SecretSerializer(Secret.objects.filter(owner=request.user),
                                         many=True).data)


class SecretView(APIView):
    """Set (PUT `{"value": ...}`) or delete one of your tracker tokens: `wandb_api_key`,
    `mlflow_token`. Stored encrypted; the answer says when it was set, never what."""

    permission_classes = [IsAuthenticated]

    @extend_schema(request=SecretBody, parameters=[SECRET_NAME], responses={
        200: SecretSerializer, 400: BAD_BODY, 401: UNAUTHENTICATED,
        404: OpenApiResponse(FIELD_ERRORS, description="not a secret's name")})
    def put(self, request: Request, name: str) -> Response:
        if name not in SecretName.values:
            return Response({"name": [f"not a secret's name; known: {', '.join(SecretName)}"]},
                            status=status.HTTP_404_NOT_FOUND)
        body = SecretBody(data=request.data)
        body.is_valid(raise_exception=True)
        secret = secrets.store(request.user.pk, name, body.validated_data["value"])
        return Response(SecretSerializer(secret).data)

    @extend_schema(parameters=[SECRET_NAME], responses={204: None, 401: UNAUTHENTICATED})
    def delete(self, request: Request, name: str) -> Response:
        Secret.objects.filter(owner=request.user, name=name).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
