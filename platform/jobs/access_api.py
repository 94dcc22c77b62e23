"""REST API of access to the platform: a password exchanged for a token, your named API
tokens and webhooks, and the audit log of control actions."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from drf_spectacular.utils import extend_schema, extend_schema_view, inline_serializer
from rest_framework import generics, mixins, serializers, status, viewsets
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.exceptions import Throttled
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.errors import DETAIL, ERRORS, FIELD_ERRORS, UNAUTHENTICATED
from jobs.login import LoginAccountThrottle, LoginAddressThrottle
from jobs.models import ApiToken, AuditEntry, Cause, Webhook
from jobs.permissions import audit, token_creation_wait
from jobs.serializers import (
    ApiTokenSerializer,
    AuditEntrySerializer,
    NewApiTokenSerializer,
    NewWebhookSerializer,
    WebhookSerializer,
)


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
        AuditEntry.record("token.create", user.get_username(), Cause.USER, user=user,
                          name=token.name, token=token.pk)
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
        audit(request, "token.create", user=request.user, name=token.name, token=token.pk)
        return Response(NewApiTokenSerializer(token).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, token: ApiToken) -> None:
        token.revoke()
        audit(self.request, "token.revoke", user=self.request.user, name=token.name,
              token=token.pk)


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
        audit(request, "webhook.create", user=request.user, job=hook.job, url=hook.url)
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

