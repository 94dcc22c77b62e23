"""The `sinks` a job names (or its owner's defaults): parsed into one config per tracker, with
errors that name the field (`sinks.1.tracking_uri`).

An entry is a tracker's name or an object with its `kind`:
`"tensorboard"`; `{"kind": "mlflow", "tracking_uri": "https://...", "experiment": "..."}`
(without `tracking_uri`: the operator's RINGSIDE_MLFLOW_TRACKING_URI; a user's must be a public
http(s) address, as a webhook's: common.addresses); `{"kind": "wandb", "mode": "offline" |
"online", "project": "...", "entity": "..."}`. Tokens are never part of an entry: they are the
user's secrets (monitor.sinks.secrets).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from common.addresses import Refused, reachable
from monitor.sinks.models import Sink, SinkDefaults, SinkKind

NAME_MAX = 128
DEFAULT_PROJECT = "ringside"
WANDB_MODES = ("offline", "online")
# each kind's fields besides `kind`, and their defaults (None: left out when not given)
FIELDS: dict[str, dict[str, str | None]] = {
    SinkKind.TENSORBOARD: {},
    SinkKind.MLFLOW: {"tracking_uri": None, "experiment": DEFAULT_PROJECT},
    SinkKind.WANDB: {"mode": "offline", "project": DEFAULT_PROJECT, "entity": None},
}


class SinkError(ValueError):
    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


def parse(value: Any, field: str = "sinks") -> list[dict[str, str]]:
    """The configs of a `sinks` list, one per tracker; SinkError maps each bad field to why."""
    if not isinstance(value, list):
        raise SinkError({field: "must be a list of tracker names or objects with a `kind`"})
    errors: dict[str, str] = {}
    configs: list[dict[str, str]] = []
    for index, entry in enumerate(value):
        config = _entry(entry, f"{field}.{index}", errors)
        if config is None:
            continue
        if any(c["kind"] == config["kind"] for c in configs):
            errors[f"{field}.{index}"] = f"{config['kind']} is named twice"
        configs.append(config)
    if errors:
        raise SinkError(errors)
    return configs


def _entry(entry: Any, at: str, errors: dict[str, str]) -> dict[str, str] | None:
    if isinstance(entry, str):
        entry = {"kind": entry}
    if not isinstance(entry, dict):
        errors[at] = "must be a tracker's name or an object with a `kind`"
        return None
    kind = entry.get("kind")
    if kind not in FIELDS:
        errors[f"{at}.kind"] = f"unknown tracker {kind!r}; known: {', '.join(FIELDS)}"
        return None
    fields = FIELDS[kind]
    for key in set(entry) - {"kind", *fields}:
        errors[f"{at}.{key}"] = f"not a field of a {kind} sink; its fields: " + (
            ", ".join(fields) or "none")
    config = {"kind": kind}
    for key, default in fields.items():
        given = entry.get(key, default)
        if given is None:
            continue
        if not isinstance(given, str) or not given or len(given) > NAME_MAX:
            errors[f"{at}.{key}"] = f"must be a non-empty string of at most {NAME_MAX} characters"
            continue
        config[key] = given
    _check(config, at, errors)
    return config


def _check(config: dict[str, str], at: str, errors: dict[str, str]) -> None:
    """What a kind asks of its fields' values."""
    if config["kind"] == SinkKind.WANDB and config.get("mode") not in WANDB_MODES:
        errors[f"{at}.mode"] = f"must be one of {', '.join(WANDB_MODES)}"
    if config["kind"] != SinkKind.MLFLOW:
        return
    if "tracking_uri" not in config:
        if not settings.RINGSIDE_MLFLOW_TRACKING_URI:
            errors[f"{at}.tracking_uri"] = ("required: this server has no tracking server of "
                                            "its own (RINGSIDE_MLFLOW_TRACKING_URI)")
        return
    try:
        reachable(config["tracking_uri"])
    except Refused as e:
        errors[f"{at}.tracking_uri"] = str(e)


def defaults_of(owner_id: int) -> list[dict[str, str]]:
    return SinkDefaults.objects.filter(owner_id=owner_id).values_list(
        "sinks", flat=True).first() or []


def attach(job: Any, configs: list[dict[str, str]] | None) -> list[Sink]:
    """Give `job` its sinks: `configs`, or (None) its owner's defaults."""
    if configs is None:
        configs = defaults_of(job.owner_id)
    return Sink.objects.bulk_create(
        [Sink(job=job, kind=config["kind"], config=config) for config in configs])
