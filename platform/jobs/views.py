"""The pages. They only render; jobs are created and steered through the REST API."""

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from engine.moe.config import PRESETS
from engine.runtime.spec import TrainSpec
from jobs.models import Job

FORM_PRESETS = ("tiny", "small")


def visible_jobs(request: HttpRequest):
    jobs = Job.objects.select_related("owner")
    return jobs if request.user.is_staff else jobs.filter(owner=request.user)


def job_list(request: HttpRequest) -> HttpResponse:
    """The home page: the job list, or the login form (200, not a redirect) for a visitor."""
    if not request.user.is_authenticated:
        return LoginView.as_view(template_name="login.html")(request)
    return render(request, "jobs/list.html", {"jobs": visible_jobs(request)[:200]})


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    defaults = TrainSpec()
    presets = {name: PRESETS[name] for name in FORM_PRESETS}
    return render(request, "jobs/new.html", {"presets": presets, "train": defaults})


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request), pk=job_id)
    return render(request, "jobs/detail.html", {"job": job})
