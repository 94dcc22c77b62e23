"""The Datasets page. It only renders; its rows come from `/api/datasets/` (polled while a
prepare is under way) and registering and preparing go through the API."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from datasets.sources import KINDS


@login_required
def datasets_page(request: HttpRequest) -> HttpResponse:
    return render(request, "datasets/list.html", {"kinds": KINDS})
