"""The pages. They only render; jobs are created and steered through the REST API."""

import dataclasses
import itertools
import json
import re
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from engine.contract import COLLECTIVES, STRATEGIES
from engine.runtime.spec import (
    DEFAULT_LADDERS,
    FAULT_KINDS,
    LADDER_ACTIONS,
    PRESETS,
    CheckpointSpec,
    DatasetSpec,
    FaultInjection,
    FaultPolicy,
    TrainSpec,
)
from jobs.login import LoginView
from jobs.models import State
from jobs.permissions import visible_jobs
from jobs.policy import PlatformPolicy

# the launch form's presets, its default first (nano: a smoke test of the platform in seconds)
FORM_PRESETS = ("tiny", "small", "nano")


def job_list(request: HttpRequest) -> HttpResponse:
    """The home page: the job list, or the login form (200, not a redirect) for a visitor."""
    if not request.user.is_authenticated:
        return LoginView.as_view()(request)
    return render(request, "jobs/list.html", {"states": State.choices})


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    """The launch form; its defaults are the engine's own, so the form and the CLI agree.
    `?clone=<id>` starts it from that job's spec instead (launch.js fills the fields)."""
    clone = _clone_source(request) if "clone" in request.GET else None
    presets = {name: PRESETS[name] for name in FORM_PRESETS}
    if clone:  # the clone's preset, offered even where the form would not offer it
        presets.setdefault(clone["preset"], PRESETS[clone["preset"]])
    return render(request, "jobs/new.html", {
        "clone": clone, "presets": presets, "train": TrainSpec(), "dataset": DatasetSpec(),
        "checkpoint": CheckpointSpec(), "policy": FaultPolicy(), "platform": PlatformPolicy(),
        "injection": FaultInjection(kind=FAULT_KINDS[0], step=1),
        "strategies": STRATEGIES, "collectives": COLLECTIVES, "fault_kinds": FAULT_KINDS,
        "ladders": {kind: ", ".join(actions) for kind, actions in DEFAULT_LADDERS.items()},
        "ladder_actions": ", ".join(LADDER_ACTIONS),
    })


def _clone_source(request: HttpRequest) -> dict[str, Any]:
    """The job to clone (one the user may see, else 404): its id and spec, the preset its
    model started from and the fields it sets apart from it (the form's model overrides)."""
    job_id = request.GET["clone"]
    if not job_id.isdigit():
        raise Http404("clone: not a job id")
    job = get_object_or_404(visible_jobs(request.user), pk=int(job_id))
    model = job.spec["model"]
    name = model.get("preset") or FORM_PRESETS[0]  # a spec of model fields only: all differ
    preset = dataclasses.asdict(PRESETS[name])
    overrides = {k: v for k, v in model.items() if k != "preset" and preset.get(k) != v}
    spec = {**job.spec, "name": _next_name(request, job.name)}
    return {"id": job.pk, "spec": spec, "preset": name, "model_overrides": overrides}


def _next_name(request: HttpRequest, name: str) -> str:
    """`name-2`, or the next suffix none of the user's jobs has (a clone of `run-2` is
    `run-3`), so that runs told apart by name stay apart."""
    base = re.sub(r"-\d+$", "", name)
    taken = set(visible_jobs(request.user).filter(name__startswith=base)
                .values_list("name", flat=True))
    return next(f"{base}-{n}" for n in itertools.count(2) if f"{base}-{n}" not in taken)


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    spec_text = json.dumps(job.spec, indent=2)
    return render(request, "jobs/detail.html", {"job": job, "spec_text": spec_text,
                                                "ladder_actions": list(LADDER_ACTIONS)})


@login_required
def compare(request: HttpRequest) -> HttpResponse:
    """Overlay the loss and throughput of chosen runs (`?jobs=3,5`), drawn by compare.js."""
    return render(request, "jobs/compare.html", {"jobs": visible_jobs(request.user)[:200]})
