"""The error bodies the REST API answers with, as its OpenAPI schema documents them (shared by
the jobs API and the telemetry reads, so every endpoint documents an error the same way)."""

from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer, inline_serializer
from rest_framework import serializers

from jobs import idempotency

DETAIL = inline_serializer("Detail", {"detail": serializers.CharField()})
# DRF's 400s: each bad field, query parameter or header (or `non_field_errors`) with its
# messages; a body that is not JSON at all answers `detail` instead
FIELD_ERRORS = {
    "type": "object",
    "description": "each bad field with its messages, or `detail` for a body that does not "
                   "parse",
    "properties": {"detail": {"type": "string"}},
    "additionalProperties": {"type": "array", "items": {"type": "string"}},
}
SPEC_ERRORS = inline_serializer(
    "SpecErrors", {"errors": serializers.DictField(child=serializers.CharField())})
IDEMPOTENCY_ERROR = inline_serializer(
    "IdempotencyKeyError", {idempotency.HEADER: serializers.ListField(
        child=serializers.CharField())})
CONFLICT = inline_serializer(
    "Conflict", {"detail": serializers.CharField(), "state": serializers.CharField()})

UNAUTHENTICATED = OpenApiResponse(DETAIL, description="not authenticated, or a revoked token")
BAD_QUERY = OpenApiResponse(FIELD_ERRORS, description="a bad query parameter, named")
# every endpoint of one job
ERRORS = {401: UNAUTHENTICATED,
          404: OpenApiResponse(DETAIL, description="no such job, or not yours")}
BAD_BODY = OpenApiResponse(FIELD_ERRORS, description="a bad body: each bad field with its "
                           "messages")
STEER_ERRORS = {**ERRORS, 400: BAD_BODY,
                409: OpenApiResponse(CONFLICT, description="the job's current state does not "
                                     "allow it; `state` names that state"),
                422: OpenApiResponse(IDEMPOTENCY_ERROR, description="Idempotency-Key "
                                     "already used for another request")}
# POST /api/jobs/: the spec's own errors, or the Idempotency-Key's, or a body that does not parse
CREATE_ERRORS = OpenApiResponse(PolymorphicProxySerializer(
    "JobCreateErrors", serializers=[SPEC_ERRORS, IDEMPOTENCY_ERROR, DETAIL],
    resource_type_field_name=None), description="a bad spec (`errors`: each bad field's dotted "
    "path with a message), a bad Idempotency-Key, or a body that does not parse (`detail`)")
