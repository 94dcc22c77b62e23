"""The Hosts page. It only renders; its rows come from `/ws/hosts/` and drains go through the
API."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def hosts_page(request: HttpRequest) -> HttpResponse:
    return render(request, "hosts/list.html")
