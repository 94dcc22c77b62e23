"""The token page (/tokens/): a person creates and revokes their named API tokens."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from jobs.models import ApiToken, AuditEntry, Cause
from jobs.permissions import token_creation_wait

NEW_KEY = "tokens.new_key"  # the session's copy of a key just created, until it is shown


@login_required
def tokens_page(request: HttpRequest) -> HttpResponse:
    """GET lists the user's tokens; POST `name` creates one, POST `revoke` (a token id)
    revokes one. Each POST that succeeds redirects (post/redirect/get: a reload does not
    submit again); a new key rides in the session to the next GET, which shows it once."""
    user, error = request.user, ""
    if request.method == "POST":
        if "revoke" in request.POST:
            token = get_object_or_404(ApiToken, user=user, pk=request.POST["revoke"])
            token.revoke()
            AuditEntry.record("token.revoke", user.get_username(), Cause.USER, user=user,
                              name=token.name, token=token.pk)
            messages.info(request, f"Token “{token.name}” revoked.")
            return redirect("tokens")
        name = request.POST.get("name", "").strip()
        wait = token_creation_wait(user)
        if not name or len(name) > 64:
            error = "name: give the token a name of 1 to 64 characters"
        elif wait is not None:
            error = f"too many new tokens this hour; try again in {wait:.0f} s"
        else:
            token = ApiToken.objects.create(user=user, name=name)
            AuditEntry.record("token.create", user.get_username(), Cause.USER, user=user,
                              name=name, token=token.pk)
            request.session[NEW_KEY] = token.key
            return redirect("tokens")
    return render(request, "tokens.html", {
        "tokens": ApiToken.objects.filter(user=user),
        "new_key": request.session.pop(NEW_KEY, None), "error": error},
        status=400 if error else 200)
