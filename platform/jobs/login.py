"""Password attempts, throttled: the login form (/login/ and the home page for a visitor) and the
token exchange (POST /api/auth/token/) each count every attempt per client address and per
username, at the `login` and `login_account` rates of DEFAULT_THROTTLE_RATES.

The client address is the connection's peer, unless the peer is one of TRUSTED_PROXIES: then
the nearest address in X-Forwarded-For that is not a trusted proxy. A header sent by anyone
else is ignored, so a new made-up address per guess does not start a new count.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle


def _trusted(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:  # not an address (a unix socket's peer, a made-up header entry)
        return False
    return any(ip in network for network in settings.TRUSTED_PROXIES)


def client_address(request: HttpRequest) -> str:
    """The address the request came from, believing X-Forwarded-For only from a trusted
    proxy: each proxy appends the address it heard from, so walking back from the peer, the
    first hop that is not a trusted proxy is the client (the leftmost, if all are)."""
    peer = request.META.get("REMOTE_ADDR", "")
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
            if h.strip()]
    if not hops or not _trusted(peer):
        return peer
    return next((hop for hop in reversed(hops) if not _trusted(hop)), hops[0])


class _LoginThrottle(SimpleRateThrottle):
    """DRF's own throttles read the rates once, at import; these read them per request, so a
    changed setting (a test's override) takes effect."""

    def get_rate(self) -> str | None:
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request: HttpRequest, view: object) -> str | None:
        ident = self.ident(request)
        return None if ident is None else self.cache_format % {"scope": self.scope,
                                                               "ident": ident}

    def ident(self, request: HttpRequest) -> str | None:
        raise NotImplementedError


class LoginAddressThrottle(_LoginThrottle):
    """Password attempts per client address."""

    scope = "login"

    def ident(self, request: HttpRequest) -> str | None:
        return client_address(request)


class LoginAccountThrottle(_LoginThrottle):
    """Password attempts per username, from whatever addresses: guesses spread over many
    addresses still count against the one account."""

    scope = "login_account"

    def ident(self, request: HttpRequest) -> str | None:
        # a DRF request's body (JSON or form), or the page's form
        body = request.data if hasattr(request, "data") else request.POST
        username = body.get("username") if hasattr(body, "get") else None
        if not username:
            return None  # no account to count against (the serializer answers 400)
        # a digest: a cache key of fixed length and characters, whatever was typed
        return hashlib.sha256(str(username).casefold().encode()).hexdigest()


LOGIN_THROTTLES = (LoginAddressThrottle, LoginAccountThrottle)


def login_wait(request: HttpRequest, view: object) -> float | None:
    """Seconds until this attempt would be allowed, None if it is allowed now. Every
    throttle counts the attempt it allows, as DRF's check of a view's throttles does."""
    waits = [throttle.wait() for throttle in (cls() for cls in LOGIN_THROTTLES)
             if not throttle.allow_request(request, view)]
    return max(w or 0.0 for w in waits) if waits else None


class LoginView(auth_views.LoginView):
    """Django's login form, throttled like the token exchange: over the rate it answers 429
    with Retry-After and says how long to wait, without checking the password."""

    template_name = "login.html"

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        wait = login_wait(request, self)
        if wait is None:
            return super().post(request, *args, **kwargs)
        seconds = max(1, math.ceil(wait))
        # an unbound form: a bound one would check the password when the page shows its
        # errors, and whether it complained would tell the guesser
        response = self.render_to_response(self.get_context_data(
            form=self.get_form_class()(self.request),
            throttled=f"Too many login attempts; try again in {seconds} s."), status=429)
        response["Retry-After"] = str(seconds)
        return response
