"""Whether a user's new job may be admitted (a create or a clone), before it queues:

- its placement priority: a user who is not staff asks for at most RINGSIDE_MAX_USER_PRIORITY
  (400 on `priority`);
- its model: the PaRO planner prices each strategy's model-state memory per device; when no
  registered host has a device that holds it in any strategy, 400 on the model fields the
  spec gave, with the smallest need and the largest device. With no host registered at all
  nothing is refused (the job waits for hosts, as any job does);
- its datasets (`train.data.mix`): each must hold one step's batch and, when the job evaluates,
  one evaluation batch held out, in a vocabulary the model holds (400 naming the field);
- the user's job quota (jobs.models.Quota): jobs queued or running at once; at the limit, 429
  naming it.

The slot quota is placement's (a job waits), the checkpoint quota the supervisor's (a job is
paused): jobs.placement, jobs.policy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException

from engine.paro.planner import DEFAULT_LINKS, Topology, plan, ranks_per_device
from engine.runtime.spec import PRESETS, JobSpec, MoEConfig, parse_spec
from hosts.models import Host
from jobs.mixtures import mixtures
from jobs.models import TERMINAL, Job, Quota, State

# the states a job counts against the jobs quota in: all but finished and (cold) paused ones,
# which hold nothing
NOT_COUNTED = frozenset(TERMINAL) | {State.PAUSED}


class NotAdmitted(APIException):
    """400 in the create body's shape: `errors`, each bad field's dotted path to a message."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "not_admitted"

    def __init__(self, errors: dict[str, str]):
        super().__init__({"errors": errors})


class QuotaReached(APIException):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = "quota_reached"


@dataclass(frozen=True)
class Fit:
    """The best a host offers a job: the model state one device must hold there, and what
    the device holds."""

    need_bytes: float
    device_bytes: float
    device: str  # e.g. "gpu-a: NVIDIA H100" or "cpu-b: memory"


def admit(user: Any, spec: dict, priority: int = 0) -> None:
    """Raise NotAdmitted (400) or QuotaReached (429) unless `user` may queue a job of `spec`
    (a valid spec) at `priority`."""
    errors: dict[str, str] = {}
    if priority > capped_priority(user, priority):
        errors["priority"] = (f"at most {settings.RINGSIDE_MAX_USER_PRIORITY} for a user who "
                              "is not staff (RINGSIDE_MAX_USER_PRIORITY)")
    parsed = parse_spec(spec)
    refusal = memory_refusal(parsed)
    if refusal is not None:
        errors.update(dict.fromkeys(size_fields(parsed), refusal))
    errors.update(mixtures().spec_errors(parsed))
    if errors:
        raise NotAdmitted(errors)
    limit = Quota.limits_of(user).jobs
    counted = Job.objects.filter(owner_id=user.pk).exclude(state__in=NOT_COUNTED).count()
    if limit is not None and counted >= limit:
        raise QuotaReached(f"your jobs quota is {limit} jobs queued or running at once and you "
                           f"have {counted}: cancel or pause one, or wait for one to finish")


def size_fields(spec: JobSpec) -> list[str]:
    """The spec's fields that set its model's size: its preset and the fields it changes from
    the preset (from the defaults without one); `model` when it sets none."""
    base = PRESETS[spec.preset] if spec.preset else MoEConfig()
    changed = [f"model.{f.name}" for f in dataclasses.fields(MoEConfig)
               if getattr(spec.model, f.name) != getattr(base, f.name)]
    return ["model.preset"] * bool(spec.preset) + changed or ["model"]


def capped_priority(user: Any, priority: int) -> int:
    """`priority` as far as `user` may ask for it."""
    if user.is_staff:
        return priority
    return min(priority, settings.RINGSIDE_MAX_USER_PRIORITY)


def memory_refusal(spec: JobSpec) -> str | None:
    """Why no registered host can hold the spec's model in any strategy; None when one can, or
    when no host is registered (or none runs the spec's device)."""
    fits = [fit for host in Host.objects.all() if (fit := host_fit(spec, host)) is not None]
    if not fits or any(f.need_bytes <= f.device_bytes for f in fits):
        return None
    least = min(fits, key=lambda f: f.need_bytes)
    largest = max(fits, key=lambda f: f.device_bytes)
    return (f"the model's state needs {least.need_bytes / 1e9:.1f} GB on a device in its "
            f"smallest strategy at this layout; the largest device of a registered host holds "
            f"{largest.device_bytes / 1e9:.1f} GB ({largest.device})")


def host_fit(spec: JobSpec, host: Host) -> Fit | None:
    """What the spec's model needs on one of the host's devices, and what that device holds;
    None when the host does not run the spec's device (a CUDA job on a CPU host)."""
    gpus = host.devices.get("gpus") or []
    wanted = spec.train.device
    if gpus and wanted != "cpu":
        best = max(gpus, key=lambda gpu: gpu.get("memory_bytes", 0))
        kind, count = "cuda", len(gpus)
        device_bytes, device = best.get("memory_bytes", 0), f"{host.name}: {best.get('name')}"
    elif wanted != "cuda":
        kind, count = "cpu", 1
        device_bytes = host.devices.get("cpu", {}).get("memory_bytes", 0)
        device = f"{host.name}: memory"
    else:
        return None
    return Fit(need_bytes=smallest_state_bytes(spec, kind)
               * ranks_per_device(spec.parallel.ranks_per_host, kind, count),
               device_bytes=device_bytes, device=device)


def smallest_state_bytes(spec: JobSpec, device: str) -> float:
    """One rank's model state (parameters, gradients, optimizer) in the strategy that needs
    least, as the planner prices it on `device` (fp32 on CPU, bf16 on GPU)."""
    p = spec.parallel
    rows = plan(spec.model, Topology(p.nodes, p.procs_per_node), 0.0, spec.train.grad_accum,
                DEFAULT_LINKS, dtype_bytes=4 if device == "cpu" else 2, collective=p.collective)
    return min(row.memory_bytes for row in rows)
