"""Who may see and steer what: API token authentication, job visibility, request causes.

The websocket consumers share these (`user_for_token`, `visible_jobs`), so a page, a script
and a live socket follow one rule: a user sees and steers only their own jobs; staff see all.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from jobs.models import ApiToken, AuditEntry, Cause, Job, token_digest

# a token's last_used is written at most this often, so reads do not each cost a write
LAST_USED_RESOLUTION_S = 60


def visible_jobs(user: AbstractBaseUser | AnonymousUser) -> QuerySet[Job]:
    """The jobs `user` may see and steer: their own, or every job for staff."""
    jobs = Job.objects.select_related("owner")
    if not user.is_authenticated:
        return jobs.none()
    return jobs if user.is_staff else jobs.filter(owner=user)


def active_token(key: str) -> ApiToken | None:
    """The unrevoked token with this key whose user is active, its last use recorded."""
    token = (ApiToken.objects.select_related("user")
             .filter(digest=token_digest(key), revoked__isnull=True, user__is_active=True).first())
    if token is not None:
        now = timezone.now()
        if token.last_used is None or (now - token.last_used).total_seconds() > \
                LAST_USED_RESOLUTION_S:
            ApiToken.objects.filter(pk=token.pk).update(last_used=now)
    return token


def user_for_token(key: str) -> AbstractBaseUser | AnonymousUser:
    """The user an API token (`?token=` on a websocket) stands for, or AnonymousUser."""
    token = active_token(key)
    return token.user if token is not None else AnonymousUser()


class ApiTokenAuthentication(authentication.TokenAuthentication):
    """`Authorization: Token <key>` with a named, revocable `ApiToken`."""

    model = ApiToken

    def authenticate_credentials(self, key: str) -> tuple[AbstractBaseUser, ApiToken]:
        token = active_token(key)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        return token.user, token


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = ApiTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema) -> dict:
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": 'An API token: "Token <key>" (create one at /tokens/ or with '
                               "POST /api/auth/token/)"}


def request_cause(request: Request) -> str:
    """API token or a person's session: the JobEvent cause of what this request does."""
    return Cause.API_TOKEN if isinstance(request.auth, ApiToken) else Cause.USER


def audit(request: Request, action: str, **details: Any) -> AuditEntry:
    """The audit entry of what this request did: by its user, through a token or a session."""
    return AuditEntry.record(action, request.user.get_username(), request_cause(request),
                             **details)



def token_creation_wait(user: AbstractBaseUser) -> float | None:
    """Seconds until `user` may create another API token, None if now: at most
    API_TOKENS_PER_HOUR in any hour, counted from the tokens themselves, so the limit holds
    across web processes and restarts."""
    hour_ago = timezone.now() - timedelta(hours=1)
    recent = list(ApiToken.objects.filter(user=user, created__gte=hour_ago)
                  .order_by("-created").values_list("created", flat=True)
                  [:settings.API_TOKENS_PER_HOUR])
    if len(recent) < settings.API_TOKENS_PER_HOUR:
        return None
    return max(1.0, (recent[-1] - hour_ago).total_seconds())
