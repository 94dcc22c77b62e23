"""The token page (/tokens/): a person creates and revokes their named API tokens."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from jobs.models import ApiToken, Cause
from jobs.permissions import token_creation_wait
from jobs.steering import audit


@login_required
def tokens_page(request: HttpRequest) -> HttpResponse:
    """GET lists the user's tokens; POST `name` creates one (its key shown once), POST
    `revoke` (a token id) revokes one."""
    user, new_key, error = request.user, None, ""
    if request.method == "POST":
        if "revoke" in request.POST:
            token = get_object_or_404(ApiToken, user=user, pk=request.POST["revoke"])
            token.revoke()
            audit("token.revoke", user.get_username(), Cause.USER, user=user, name=token.name,
                  token=token.pk)
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
            audit("token.create", user.get_username(), Cause.USER, user=user, name=name,
                  token=token.pk)
            new_key = token.key
    return render(request, "tokens.html", {
        "tokens": ApiToken.objects.filter(user=user), "new_key": new_key, "error": error},
        status=400 if error else 200)
