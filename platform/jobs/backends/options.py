"""A job's choice of backend and that backend's options, as the create body gives them beside
the spec: `backend` ("hosts" or "slurm"; default RINGSIDE_BACKEND) and `slurm` (`partition`,
`account`, `qos`, `constraint`, `gres`, `time_limit` in minutes). Every string lands on an
`#SBATCH` line, so each is held to Slurm's own name syntax (no space, newline or shell
character). A Slurm job is also checked against its partition's limits (the nodes, the time
limit; from `scontrol`, or from slurmrestd where RINGSIDE_SLURMRESTD_URL is set), each error
naming the field it is about."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from jobs.backends.base import NAMES
from jobs.backends.slurm import slurm
from jobs.backends.slurm_calls import SlurmError

NAME = r"^[A-Za-z0-9_.-]{1,64}$"


class SlurmOptions(serializers.Serializer):
    partition = serializers.RegexField(NAME, required=False)
    account = serializers.RegexField(NAME, required=False)
    qos = serializers.RegexField(NAME, required=False)
    constraint = serializers.RegexField(r"^[A-Za-z0-9_.&|\[\]*:-]{1,128}$", required=False,
                                        help_text="node features, e.g. a100&ib")
    gres = serializers.RegexField(r"^[a-z]+(:[A-Za-z0-9_.-]+)?:[0-9]{1,3}$", required=False,
                                  help_text="per node, e.g. gpu:4 or gpu:a100:8")
    time_limit = serializers.IntegerField(min_value=1, max_value=525600, required=False,
                                          help_text="minutes")


def parse(data: dict[str, Any], hosts: int, errors: dict[str, str]) -> tuple[str, dict]:
    """(backend, its options) from a create body; adds each bad field's message to `errors`."""
    backend = data.get("backend", settings.BACKEND)
    if backend not in NAMES:
        errors["backend"] = f"must be one of {', '.join(NAMES)}"
        return backend, {}
    given = data.get("slurm")
    if given is None:
        return backend, {}
    if backend != "slurm":
        errors["slurm"] = "only a job on the slurm backend takes Slurm options"
        return backend, {}
    body = SlurmOptions(data=given if isinstance(given, dict) else {})
    if not isinstance(given, dict):
        errors["slurm"] = "must be an object"
    elif set(given) - set(body.fields):
        errors.update({f"slurm.{k}": "unknown field" for k in set(given) - set(body.fields)})
    elif not body.is_valid():
        errors.update({f"slurm.{k}": " ".join(map(str, v)) for k, v in body.errors.items()})
    else:
        errors.update(partition_errors(body.validated_data, hosts))
        return backend, {"slurm": body.validated_data}
    return backend, {}


def partition_errors(options: dict[str, Any], hosts: int) -> dict[str, str]:
    """What the partition would refuse: more nodes than its MaxNodes (`parallel.hosts`), a
    longer time limit than its MaxTime (`slurm.time_limit`), or no such partition, as Slurm
    (its clients, or slurmrestd: jobs.backends.slurm's `slurm()`) shows its partitions."""
    name = options.get("partition", "")
    try:
        known = slurm().partitions()
    except SlurmError as error:
        field = "slurm.partition" if name else "backend"
        return {field: f"Slurm does not answer for it: {error}"}
    partition = next((p for p in known if (p.name == name if name else p.default)), None)
    if partition is None:
        return {"slurm.partition": f"the cluster has no partition {name}" if name else
                "the cluster has no default partition: name one"}
    errors = {}
    if partition.max_nodes is not None and hosts > partition.max_nodes:
        errors["parallel.hosts"] = (f"partition {partition.name} allows at most "
                                    f"{partition.max_nodes} nodes a job; this asks for {hosts}")
    most = partition.max_minutes
    if most is not None and options.get("time_limit", 0) > most:
        errors["slurm.time_limit"] = f"partition {partition.name} allows at most {most} minutes"
    return errors
