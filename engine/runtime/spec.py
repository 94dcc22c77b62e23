"""The job spec: one typed object, parsed from JSON with an error for every bad field.

The platform and the engine validate with the same code (`parse_spec`), so a spec the API
accepts is a spec the engine runs. Errors are collected, not raised one at a time: a
`SpecError` carries `{dotted.field.path: message}` for every problem found.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

# The platform reads the engine's spec rules here only (tests/test_import_rules.py), so this
# module re-exports (`X as X`) what a spec is built from (presets, fault kinds, the policy's
# ladders), the errors it raises, which paths its data may name, what its checkpoint folder holds
from engine.anomaly.inject import FAULT_KINDS as FAULT_KINDS
from engine.anomaly.inject import FaultInjection
from engine.anomaly.policy import BOUNDS as POLICY_BOUNDS
from engine.anomaly.policy import DEFAULT_LADDERS as DEFAULT_LADDERS
from engine.anomaly.policy import LADDER_ACTIONS as LADDER_ACTIONS
from engine.anomaly.policy import FaultPolicy, policy_errors
from engine.checkpoint.layout import find_latest_good as find_latest_good
from engine.checkpoint.layout import present as present
from engine.contract import COLLECTIVES, STRATEGIES
from engine.data.needs import SourceSize as SourceSize  # re-exported for the platform
from engine.data.needs import data_errors as data_errors
from engine.errors import ConfigError as ConfigError
from engine.errors import SpecError
from engine.moe.config import BOUNDS as MODEL_BOUNDS
from engine.moe.config import PRESETS, MoEConfig
from engine.runtime.confine import OUTSIDE as OUTSIDE
from engine.runtime.confine import expand as expand
from engine.runtime.confine import glob_base as glob_base
from engine.runtime.confine import is_under as is_under
from engine.runtime.confine import scrub_paths as scrub_paths

# Upper bounds of this module's numeric fields ("*": every item of a list), checked in
# _check_semantics; they keep a run finite in steps, memory and disk. Model and policy fields
# have theirs next to their own checks; SPEC_BOUNDS below is all of them, by spec field.
BOUNDS: dict[str, int] = {
    "parallel.nodes": 1024,
    "parallel.procs_per_node": 64,
    "parallel.hosts": 1024,
    "train.steps": 1_000_000,
    "train.micro_batch": 4096,
    "train.grad_accum": 1024,
    "train.seq_len": 1 << 20,
    "train.lr": 10,
    "train.warmup": 1_000_000,
    "train.weight_decay": 10,
    "train.grad_clip": 1_000_000,
    "train.seed": 2**32 - 1,
    "train.eval_every": 1_000_000,
    "train.eval_batches": 1000,
    "train.trace_every": 1_000_000,
    "train.threads": 1024,
    "checkpoint.every": 1_000_000,
    "checkpoint.keep": 1000,
    "checkpoint.memory_every": 1_000_000,
    "faults.inject.*.factor": 1000,
    "eval.heldout_windows": 4096,
    "eval.slots": 4,
}
SPEC_BOUNDS: dict[str, int] = {
    **BOUNDS,
    **{f"model.{name}": most for name, most in MODEL_BOUNDS.items()},
    **{f"faults.policy.{name}": most for name, most in POLICY_BOUNDS.items()},
}


@dataclass
class ParallelSpec:
    nodes: int = 1
    procs_per_node: int = 1
    strategy: str = "NNN"
    collective: Literal[COLLECTIVES] = "native"  # the contract's names, checked by _convert
    # the hosts the nodes are spread over evenly; one node per host is the production shape
    hosts: int = 1
    min_hosts: int | None = None  # the fewest hosts the job may continue on; None = hosts
    scale_up: bool = True  # grow back to `hosts` when hosts return

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def ranks_per_host(self) -> int:
        """Each host's ranks: the nodes spread evenly over the hosts (parse_spec checks it)."""
        return self.world_size // self.hosts


@dataclass
class DatasetSpec:
    kind: Literal["stdlib", "text", "jsonl", "parquet"] = "stdlib"
    paths: list[str] = field(default_factory=list)  # globs (or s3:// prefixes), for the others
    field: str = "text"  # the JSONL field (Parquet column) that holds the text
    tokenizer: str = "bytes"  # "bytes", a tokenizer.json, or a Hugging Face tokenizer folder
    holdout: float = 0.01  # fraction held out for eval_loss


@dataclass
class MixEntry:
    """A prepared dataset in the mixture (engine.data): its folder or object-store URL."""

    path: str
    weight: float = 1.0
    name: str = ""  # shown in per-source curves; default: the folder's name


@dataclass
class TrainData:
    mix: list[MixEntry] = field(default_factory=list)  # empty: train.dataset alone
    document_mask: bool = False  # attention stays inside each packed document


@dataclass
class TrainSpec:
    steps: int = 100
    micro_batch: int = 8
    grad_accum: int = 1
    seq_len: int = 256
    lr: float = 2e-3
    warmup: int = 20
    decay_end: int = 0  # the step the cosine decay reaches min_lr_ratio; 0 = steps
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 50
    eval_batches: int = 4
    # steps between full per-op timelines (Chrome traces); 0 = on request and after anomalies
    trace_every: int = 500
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int = 0  # torch intra-op threads per rank; 0 = cores / ranks
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    data: TrainData = field(default_factory=TrainData)


@dataclass
class CheckpointSpec:
    every: int = 50  # optimizer steps between disk checkpoints; 0 = only at the end
    keep: int = 3
    memory_every: int = 0
    # on several hosts, each host's memory snapshots are also held by the next host (a ring),
    # so a lost host's shards survive in memory
    replicas: bool = True
    dir: str = ""  # default: runs/<name>/checkpoints


@dataclass
class EvalSpec:
    """How the platform evaluates the job's checkpoints (jobs.evaluations); the engine's
    training ignores it. `on_checkpoint`: every disk checkpoint, as soon as it is published."""

    on_checkpoint: bool = False
    tasks: str = ""  # a JSONL task file (engine.evaluate); "" = held-out loss only
    heldout_windows: int = 32  # per source
    slots: int = 1  # the most at once, of those training leaves free


@dataclass
class FaultsSpec:
    policy: FaultPolicy = field(default_factory=FaultPolicy)
    inject: list[FaultInjection] = field(default_factory=list)


@dataclass
class ModelInit:
    """Where the first weights come from (`model.init_from`, engine.runtime.init_from): a
    Hugging Face Glm4Moe folder or a Ringside checkpoint; "" = a fresh initialisation."""

    init_from: str = ""
    init_optimizer: bool = False  # a Ringside checkpoint's Adam state too


@dataclass
class DataAccess:
    """What the job may read (engine.runtime.confine). The platform writes it into the spec it
    launches; a user's spec never sets it."""

    roots: list[str] = field(default_factory=list)  # empty: any path (the engine's CLI)


@dataclass
class JobSpec:
    name: str
    model: MoEConfig = field(default_factory=MoEConfig)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    faults: FaultsSpec = field(default_factory=FaultsSpec)
    data: DataAccess = field(default_factory=DataAccess)
    eval: EvalSpec = field(default_factory=EvalSpec)
    # the preset the model fields started from, kept so the UI can show it
    preset: str = ""
    # given in the model section, beside the MoEConfig fields (not a field of its own)
    init: ModelInit = field(default_factory=ModelInit, init=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; `parse_spec(spec.to_dict())` gives back an equal spec."""
        data = dataclasses.asdict(self)
        init = {k: v for k, v in data.pop("init").items() if v}  # a fresh start adds nothing
        data["model"] = {**({"preset": self.preset} if self.preset else {}), **init,
                         **data["model"]}
        del data["preset"]
        if not self.data.roots:  # unconfined, as every spec a user writes
            del data["data"]
        return data


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def parse_spec(data: Any) -> JobSpec:
    """Validate a JSON-decoded spec; raise SpecError naming every bad field."""
    errors: dict[str, str] = {}
    if not isinstance(data, dict):
        raise SpecError({"": "the spec must be a JSON object"})
    data = dict(data)
    model_data = data.pop("model", {})
    preset_name = ""
    model = None
    init_data: dict[str, Any] = {}
    if not isinstance(model_data, dict):
        errors["model"] = "must be an object"
    else:
        model_data = dict(model_data)
        preset_name = model_data.pop("preset", "")
        init_data = {k: model_data.pop(k) for k in ("init_from", "init_optimizer")
                     if k in model_data}
        base: MoEConfig | None = MoEConfig()
        if preset_name:
            if preset_name not in PRESETS:
                errors["model.preset"] = f"unknown preset; valid: {', '.join(PRESETS)}"
                base = None
            else:
                base = PRESETS[preset_name]
        if base is not None:
            model = _build(MoEConfig, model_data, "model", errors, base=base)
            _add_new(errors, {f"model.{k}": v for k, v in model.validate().items()})

    spec = _build(JobSpec, {**data, "model": {}}, "", errors)
    init = _build(ModelInit, init_data, "model", errors)
    if spec is not None:
        if model is not None:
            spec.model = model
        spec.preset = preset_name
        spec.init = init or ModelInit()
        if spec.parallel.min_hosts is None:
            spec.parallel.min_hosts = spec.parallel.hosts
        _add_new(errors, _check_semantics(spec))
    if errors:
        raise SpecError(errors)
    assert spec is not None
    return spec


def share_errors(shares: object, world_size: int, global_batch: int, grad_accum: int) -> str | None:
    """Why `shares` cannot be the ranks' shares of a step (a `rebalance`: one count of samples
    per data-parallel rank, each at least one per micro-step, summing to the global batch),
    or None."""
    if (not isinstance(shares, list) or len(shares) != world_size
            or any(isinstance(n, bool) or not isinstance(n, int) for n in shares)):
        return f"must be a list of {world_size} whole numbers of samples, one per rank"
    if sum(shares) != global_batch:
        return (f"must sum to the global batch of {global_batch} samples "
                f"(micro_batch x ranks x grad_accum), not {sum(shares)}")
    if min(shares) < grad_accum:
        return f"each rank needs at least {grad_accum} (one per micro-step)"
    return None


def with_layout(data: dict[str, Any], parallel: dict[str, Any],
                micro_batch: int | None = None, grad_accum: int | None = None) -> dict[str, Any]:
    """Spec data as it is after a reshard onto `parallel` (and `micro_batch` and
    `grad_accum`, the per-rank share of the same global batch): injected faults on ranks the
    new layout lacks are dropped, since the rank they name is no longer part of the job."""
    parallel = {**data.get("parallel", {}), **parallel}
    world = int(parallel.get("nodes", 1)) * int(parallel.get("procs_per_node", 1))
    faults = data.get("faults", {})
    inject = [i for i in faults.get("inject", [])
              if not isinstance(i, dict) or int(i.get("rank", 0)) < world]
    spec = {**data, "parallel": parallel, "faults": {**faults, "inject": inject}}
    train = {name: value for name, value in
             (("micro_batch", micro_batch), ("grad_accum", grad_accum)) if value is not None}
    if train:
        spec["train"] = {**data.get("train", {}), **train}
    return spec


def resharded(spec: JobSpec, parallel: dict[str, Any]) -> JobSpec:
    """`spec` moved onto the layout `parallel` with the same micro_batch (what a reshard
    does); SpecError naming the field if that layout is no valid spec or the global
    micro-batch does not divide over its ranks."""
    moved = parse_spec(with_layout(spec.to_dict(), parallel))
    batch, world = spec.train.micro_batch * spec.parallel.world_size, moved.parallel.world_size
    if batch % world:
        raise SpecError({"parallel.nodes": (
            f"the global micro-batch ({spec.train.micro_batch} x {spec.parallel.world_size} "
            f"sequences) does not divide over {world} ranks")})
    return moved


def reshard_layout(spec: JobSpec, args: dict[str, Any]) -> dict[str, Any]:
    """The `parallel` part of a reshard's `args` (strategy, nodes, procs_per_node, and `hosts`
    where a reshard also moves the job onto another number of hosts: a new Slurm allocation),
    the fewest hosts of `spec` kept at most the new count."""
    layout = {k: args[k] for k in ("strategy", "nodes", "procs_per_node", "hosts") if k in args}
    if "hosts" in layout:
        layout["min_hosts"] = min(spec.parallel.min_hosts or 1, layout["hosts"])
    return layout


def layout_on_hosts(data: dict[str, Any], hosts: int) -> dict[str, Any]:
    """Spec data for running the job of `data` on `hosts` hosts instead of its
    `parallel.hosts`: the same nodes per host, and the same global batch (micro_batch x
    grad_accum x ranks), by changing grad_accum while micro_batch divides the new per-rank
    share, else by the largest micro_batch under the old one that does (a rank's memory never
    grows). The result runs on `hosts` hosts: its `parallel.hosts` is `hosts` (so it can be
    laid out again) and `min_hosts` at most that. SpecError, naming the field, if the nodes or
    the global batch do not divide over the new hosts."""
    spec = parse_spec(data)
    p, t = spec.parallel, spec.train
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise SpecError({"parallel.hosts": f"must be a positive integer, got {hosts!r}"})
    nodes = p.nodes // p.hosts * hosts  # parse_spec checked that p.hosts divides p.nodes
    world = nodes * p.procs_per_node
    global_batch = t.micro_batch * t.grad_accum * p.world_size
    if global_batch % world:
        raise SpecError({"parallel.hosts": (
            f"the global batch ({global_batch} sequences) does not divide over the {world} "
            f"ranks of {hosts} hosts")})
    per_rank = global_batch // world
    micro_batch = max(m for m in range(1, min(t.micro_batch, per_rank) + 1) if per_rank % m == 0)
    parallel = {"nodes": nodes, "hosts": hosts, "min_hosts": min(p.min_hosts or hosts, hosts)}
    laid = with_layout(spec.to_dict(), parallel, micro_batch, per_rank // micro_batch)
    parse_spec(laid)  # a bound the new layout passes (grad_accum, nodes) is named
    return laid


# -- live settings: what a `set` command may change in a running job (engine.runtime.settings
# applies the changes) --

LR_FACTOR = "train.lr_factor"
MIX_WEIGHTS = "train.data.mix_weights"
SPEC_KEYS = (
    "train.lr", "train.warmup", "train.decay_end", "train.min_lr_ratio", "train.grad_clip",
    "train.weight_decay", "train.eval_every", "checkpoint.every", "checkpoint.keep",
    "checkpoint.memory_every", "faults.policy.thresholds", "faults.policy.actions",
)
SETTABLE = (*SPEC_KEYS, LR_FACTOR, MIX_WEIGHTS)


def validate_settings(changes: Any) -> dict[str, Any]:
    """The changes as they are applied (ints where the spec has floats become floats);
    SpecError naming every bad key, the spec's own message for a bad value."""
    if not isinstance(changes, dict) or not changes:
        raise SpecError({"": "give at least one setting, as {dotted key: value}"})
    errors: dict[str, str] = {}
    spec_data: dict[str, Any] = {"name": "settings"}
    for key, value in changes.items():
        if key == LR_FACTOR:
            if not _positive(value):
                errors[key] = "must be a positive number"
        elif key == MIX_WEIGHTS:
            if not isinstance(value, list) or not value or not all(map(_positive, value)):
                errors[key] = "must be a list of positive numbers, one per source"
        elif key in SPEC_KEYS:
            section, *middle, name = key.split(".")
            node = spec_data.setdefault(section, {})
            for part in middle:
                node = node.setdefault(part, {})
            node[name] = value
        else:
            errors[key] = f"not a live setting; valid: {', '.join(SETTABLE)}"
    try:
        # no rule across fields involves a settable key, so the defaults stand in for the rest
        parsed = parse_spec(spec_data)
    except SpecError as e:
        errors.update(e.errors)
    if errors:
        raise SpecError(errors)
    return {key: _live_value(parsed, key, value) for key, value in changes.items()}


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) \
        and math.isfinite(value) and value > 0


def _live_value(parsed: JobSpec, key: str, value: Any) -> Any:
    if key == LR_FACTOR:
        return float(value)
    if key == MIX_WEIGHTS:
        return [float(w) for w in value]
    return _field(parsed, key)


def launched_values(spec: JobSpec) -> dict[str, Any]:
    """Every live setting's value in `spec`, before any `set` (the lr factor is 1)."""
    return {**{key: _field(spec, key) for key in SPEC_KEYS}, LR_FACTOR: 1.0,
            MIX_WEIGHTS: [entry.weight for entry in spec.train.data.mix] or [1.0]}


def _add_new(errors: dict[str, str], found: dict[str, str]) -> None:
    """Add errors for fields that have none yet: a field that failed its type check was
    defaulted, and a check across fields must not blame it a second time."""
    for path, message in found.items():
        errors.setdefault(path, message)


def _data_errors(t: TrainSpec) -> dict[str, str]:
    errors: dict[str, str] = {}
    d = t.dataset
    if d.kind != "stdlib" and not d.paths:
        errors["train.dataset.paths"] = f"a {d.kind} dataset needs at least one path or glob"
    if not 0 < d.holdout < 0.5:
        errors["train.dataset.holdout"] = "must be between 0 and 0.5"
    for i, entry in enumerate(t.data.mix):
        if not entry.weight > 0:
            errors[f"train.data.mix.{i}.weight"] = "must be a positive number"
        if not entry.path:
            errors[f"train.data.mix.{i}.path"] = "names a prepared dataset's folder or URL"
    return errors


def _check_semantics(spec: JobSpec) -> dict[str, str]:
    errors: dict[str, str] = {}
    if not _NAME.match(spec.name):
        errors["name"] = "1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
    p, t, c = spec.parallel, spec.train, spec.checkpoint
    for path, value in [
        ("parallel.nodes", p.nodes), ("parallel.procs_per_node", p.procs_per_node),
        ("train.steps", t.steps), ("train.micro_batch", t.micro_batch),
        ("train.grad_accum", t.grad_accum), ("train.seq_len", t.seq_len),
        ("train.eval_batches", t.eval_batches), ("checkpoint.keep", c.keep),
        ("eval.slots", spec.eval.slots),
    ]:
        if value < 1:
            errors[path] = "must be at least 1"
    for path, value in [
        ("train.warmup", t.warmup), ("train.eval_every", t.eval_every),
        ("train.threads", t.threads), ("train.seed", t.seed), ("train.decay_end", t.decay_end),
        ("train.trace_every", t.trace_every), ("train.weight_decay", t.weight_decay),
        ("checkpoint.every", c.every), ("checkpoint.memory_every", c.memory_every),
        ("eval.heldout_windows", spec.eval.heldout_windows),
    ]:
        if value < 0:
            errors[path] = "must be at least 0"
    for path, most in BOUNDS.items():
        if "*" not in path and _field(spec, path) > most:
            errors.setdefault(path, f"must be at most {most}")
    _add_new(errors, _hosts_errors(p))  # a count past its bound is named as such
    if p.strategy not in (*STRATEGIES, "auto"):
        errors["parallel.strategy"] = f"unknown strategy; valid: {', '.join(STRATEGIES)}, auto"
    if not t.lr > 0:  # NaN too
        errors["train.lr"] = "must be a positive number"
    if not 0 <= t.min_lr_ratio <= 1:
        errors["train.min_lr_ratio"] = "must be between 0 and 1"
    if t.grad_clip < 0:
        errors["train.grad_clip"] = "must be at least 0 (0 disables clipping)"
    if t.seq_len > spec.model.max_position_embeddings:
        errors.setdefault("train.seq_len", (  # past its own bound: that one is named
            f"must be at most model.max_position_embeddings ({spec.model.max_position_embeddings})"
        ))
    if spec.init.init_optimizer and not spec.init.init_from:
        errors["model.init_optimizer"] = "needs model.init_from (a Ringside checkpoint)"
    errors.update(_data_errors(t))
    errors.update(policy_errors(spec.faults.policy))
    for i, inj in enumerate(spec.faults.inject):
        if not 1 <= inj.step <= t.steps:
            errors[f"faults.inject.{i}.step"] = f"must be between 1 and train.steps ({t.steps})"
        if not 0 <= inj.rank < p.world_size:
            errors[f"faults.inject.{i}.rank"] = f"must be a rank below {p.world_size}"
        if inj.until and inj.until < inj.step:
            errors[f"faults.inject.{i}.until"] = f"must be 0 or at least its step ({inj.step})"
        if inj.factor > BOUNDS["faults.inject.*.factor"]:
            errors[f"faults.inject.{i}.factor"] = (
                f"must be at most {BOUNDS['faults.inject.*.factor']}")
    return errors


def _hosts_errors(p: ParallelSpec) -> dict[str, str]:
    """The nodes spread evenly over the hosts, and the fewest hosts between 1 and all."""
    if p.hosts < 1:
        return {"parallel.hosts": "must be at least 1"}
    if p.nodes % p.hosts:
        return {"parallel.hosts": f"must divide parallel.nodes ({p.nodes}): the nodes are "
                                  "spread evenly over the hosts"}
    if not 1 <= (p.min_hosts or 0) <= p.hosts:
        return {"parallel.min_hosts": f"must be between 1 and parallel.hosts ({p.hosts})"}
    return {}


def _field(spec: JobSpec, path: str) -> Any:
    """The value at a dotted spec path ("train.steps")."""
    value: Any = spec
    for name in path.split("."):
        value = getattr(value, name)
    return value


def _build(cls: type, data: Any, path: str, errors: dict[str, str], base: Any = None) -> Any:
    """Build dataclass `cls` from `data`, recording an error per bad field under `path`."""
    if not isinstance(data, dict):
        errors[path or cls.__name__] = "must be an object"
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        sub = f"{path}.{key}" if path else key
        if key not in fields:
            errors[sub] = "unknown field"
            continue
        converted = _convert(hints[key], value, sub, errors)
        if converted is not _INVALID:
            kwargs[key] = converted
    missing = False
    for name, f in fields.items():
        if name in kwargs or base is not None:
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if name not in data:  # else its bad value is already named
                errors[f"{path}.{name}" if path else name] = "this field is required"
            missing = True
    if missing:
        return None
    # bad fields keep their defaults, so the checks across fields still run on the rest
    return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)


class _Invalid:
    pass


_INVALID = _Invalid()


def _convert(hint: Any, value: Any, path: str, errors: dict[str, str]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        built = _build(hint, value, path, errors)
        return _INVALID if built is None else built
    if origin is Literal:
        if value not in args:
            errors[path] = f"must be one of: {', '.join(map(str, args))}"
            return _INVALID
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, path, errors)
    if origin is list:
        if not isinstance(value, list):
            errors[path] = "must be a list"
            return _INVALID
        items = [_convert(args[0], v, f"{path}.{i}", errors) for i, v in enumerate(value)]
        return _INVALID if any(i is _INVALID for i in items) else items
    if origin is dict:
        if not isinstance(value, dict):
            errors[path] = "must be an object"
            return _INVALID
        if any("\x00" in str(k) for k in value):
            errors[path] = "a key contains a NUL character"
            return _INVALID
        items = {k: _convert(args[1], v, f"{path}.{k}", errors) for k, v in value.items()}
        return _INVALID if any(v is _INVALID for v in items.values()) else items
    if hint is bool:
        if not isinstance(value, bool):
            errors[path] = "must be true or false"
            return _INVALID
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            errors[path] = "must be an integer"
            return _INVALID
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            errors[path] = "must be a number"
            return _INVALID
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            errors[path] = "must be a string"
            return _INVALID
        if "\x00" in value:  # PostgreSQL refuses it in the stored spec
            errors[path] = "must not contain a NUL character"
            return _INVALID
        return value
    raise TypeError(f"spec field {path} has an unsupported type {hint!r}")
