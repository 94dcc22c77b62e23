"""What crosses the engine/platform seam, defined once: events, commands, exit codes, job
states, strategy names and the checkpoint-folder rules.

The engine owns this module and emits only through it; the platform (ingest, supervisor,
websocket consumers, API) parses only through it. It imports nothing but the standard library,
so web processes that import it never load torch.

Events travel as flat JSON objects `{type, job, step, time, seq, ...fields}`. Each type is a
dataclass below: `event.to_dict()` gives the wire form, `parse_event(data)` the typed event,
raising `ContractError` naming the bad field for anything malformed (the ingest stores such an
event as it came and logs why). Fields an event type does not declare are kept in `details`
(flattened back on the wire), so an engine that adds a field never breaks an older reader.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import re
import tempfile
import types
import typing
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any, ClassVar

# Re-exported (`X as X`) for the platform, which imports no other engine module but the spec's,
# the bus's and the planner's (tests/test_import_rules.py): the free port a host's launchers meet
# at (--rdzv-endpoint) and the platform's own services listen on; the Prometheus exposition's
# content type and label sets, which the platform's goodput gauges share with the engine's.
# Both are standard library only, as this module is.
from engine.ports import free_port as free_port
from engine.xputimer.prometheus import CONTENT_TYPE as CONTENT_TYPE
from engine.xputimer.prometheus import labels as labels

# -- names ---------------------------------------------------------------------------------

# PaRO strategies (paro-horing.md): where parameters, gradients and optimizer states live
STRATEGIES = ("NNN", "NNG", "NGG", "GGG", "NII", "NIG", "IIG", "IGG", "ING", "III")
COLLECTIVES = ("native", "ring", "hier", "horing")


class ExitCode(IntEnum):
    """How `python -m engine.train` ends (a signal ends it with 128 + the signal's number)."""

    COMPLETED = 0
    FAILED = 1
    USAGE = 2  # a bad spec or command line: nothing ran
    PAUSED = 3  # a checkpoint was written; `--resume` continues the run
    CANCELLED = 4  # by a cancel command


class JobState(StrEnum):
    """A job's lifecycle (DESIGN.md §3). The engine reports the states it passes through in
    `state` events; the platform's state machine moves between all of them."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    # the ranks idle in memory, the worker held (the engine's `state` event: paused, mode warm)
    PAUSED_WARM = "paused_warm"
    # it lost hosts and fewer than `parallel.min_hosts` remain: it resumes when capacity returns
    WAITING_FOR_HOSTS = "waiting_for_hosts"
    ROLLING_BACK = "rolling_back"
    RESHARDING = "resharding"
    COMPLETING = "completing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


# the id of the pause a Slurm time limit asks for (engine.runtime.slurm): the platform knows it
# from its acknowledgement and submits the job again from the checkpoint the pause writes
TIME_LIMIT_COMMAND = "slurm-time-limit"


class CommandKind(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    CHECKPOINT = "checkpoint"
    ROLLBACK = "rollback"
    RESHARD = "reshard"
    SET = "set"  # live hyper-parameters (engine.runtime.settings)
    DECIDE = "decide"  # a person's answer to a proposal (engine.runtime.approvals)
    REBALANCE = "rebalance"  # the ranks' shares of the batch (engine.runtime.rebalance)


class PauseMode(StrEnum):
    """`pause` args `mode`: cold (the default) checkpoints and stops the ranks, freeing the
    worker; warm keeps them alive at a step boundary, their state in memory, until a `resume`
    (or, past `max_s`, turns cold)."""

    COLD = "cold"
    WARM = "warm"


WARM_PAUSE_MAX_S = 600.0  # `pause` args `max_s` when absent: how long a warm pause may last


class ShareMode(StrEnum):
    """`rebalance` args `shares`, when not a list of samples per rank: follow the ranks'
    measured speeds (auto, the fault policy's answer to a straggler) or go back to even."""

    AUTO = "auto"
    EVEN = "even"


@dataclass(frozen=True)
class CommandRule:
    """When a command may be issued and the state the job takes while it is carried out
    (None: the job keeps its state)."""

    allowed_in: frozenset[JobState]
    moves_to: JobState | None


_S = JobState
COMMAND_RULES: dict[CommandKind, CommandRule] = {
    CommandKind.PAUSE: CommandRule(frozenset({_S.RUNNING}), _S.PAUSING),
    # a cold pause is queued again; a warm one goes on in its running engine (→ running)
    CommandKind.RESUME: CommandRule(frozenset({_S.PAUSED, _S.PAUSED_WARM}), _S.QUEUED),
    CommandKind.CANCEL: CommandRule(frozenset(_S) - FINAL_STATES, _S.CANCELLED),
    CommandKind.CHECKPOINT: CommandRule(frozenset({_S.RUNNING}), None),
    CommandKind.ROLLBACK: CommandRule(frozenset({_S.RUNNING}), _S.ROLLING_BACK),
    CommandKind.RESHARD: CommandRule(frozenset({_S.RUNNING}), _S.RESHARDING),
    CommandKind.SET: CommandRule(frozenset({_S.RUNNING}), None),
    CommandKind.DECIDE: CommandRule(frozenset({_S.RUNNING}), None),
    CommandKind.REBALANCE: CommandRule(frozenset({_S.RUNNING}), None),
}


class ContractError(ValueError):
    """Malformed data at the seam; `field` names what is wrong (dotted path)."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


# -- commands ------------------------------------------------------------------------------

@dataclass
class Command:
    """One control request for a running job: `{id, kind, args}` on the control stream or in
    the run's `control.jsonl`. `id` is what the engine's `action` event names."""

    kind: CommandKind
    args: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": str(self.kind), "args": self.args}
        if self.id:
            data["id"] = self.id
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Command:
        if not isinstance(data, dict):
            raise ContractError("command", "must be a JSON object")
        kind = data.get("kind")
        if kind not in tuple(CommandKind):
            raise ContractError("command.kind", f"must be one of {', '.join(CommandKind)}")
        args = data.get("args", {})
        if not isinstance(args, dict):
            raise ContractError("command.args", "must be an object")
        return cls(kind=CommandKind(kind), args=args, id=str(data.get("id", "")))


# -- events --------------------------------------------------------------------------------

class Header(StrEnum):
    """The keys every event's wire form begins with, in this order (the order every reader of
    a run's events.jsonl has seen)."""

    TYPE = "type"
    JOB = "job"
    STEP = "step"
    TIME = "time"
    SEQ = "seq"


@dataclass(kw_only=True)
class Event:
    """Fields every event has. `job`, `time` and `seq` are stamped by the event log."""

    type: ClassVar[str]
    step: int
    job: str = ""
    time: float = 0.0
    seq: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: flat, None-valued optional fields left out, non-finite floats as
        strings (NaN is not JSON; a NaN loss must stay visible)."""
        data: dict[str, Any] = {"type": self.type}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "details" or (value is None and _optional(f)):
                continue
            data[f.name] = value
        data.update(self.details)
        return _jsonable(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        known, missing = {}, []
        for name, hint, required in _declared(cls):
            if name not in data:
                if required:
                    missing.append(name)
                continue
            known[name] = _checked(f"{cls.type}.{name}", data[name], hint)
        if missing:
            raise ContractError(f"{cls.type}.{missing[0]}", "is required")
        details = {k: v for k, v in data.items() if k != "type" and k not in known
                   and k not in _field_names(cls)}
        return cls(**known, details=details)


@functools.cache
def _declared(cls: type[Event]) -> tuple[tuple[str, Any, bool], ...]:
    """(name, type, required) of each wire field; cached: resolving the annotations takes a
    hundred microseconds, ten times the rest of parsing an event (the ingest parses thousands
    a second)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name], f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls) if f.name != "details")


@functools.cache
def _field_names(cls: type[Event]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _optional(f: dataclasses.Field) -> bool:
    return f.default is None


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, StrEnum):
        return str(value)
    return value


def _checked(name: str, value: Any, hint: Any) -> Any:
    """`value` if it is of the annotated type (numbers may be NaN/inf strings), else raise."""
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for kind in allowed:
        origin = typing.get_origin(kind) or kind
        if kind is type(None) and value is None:
            return value
        if origin is float:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            if value in ("nan", "inf", "-inf"):
                return float(value)
        elif origin is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif origin is typing.Any:
            return value
        elif isinstance(origin, type) and isinstance(value, origin):
            return value
    names = " or ".join("null" if k is type(None) else getattr(typing.get_origin(k) or k,
                                                               "__name__", str(k))
                        for k in allowed)
    raise ContractError(name, f"must be {names}, got {type(value).__name__}")


@dataclass(kw_only=True)
class StateEvent(Event):
    """A lifecycle change of the engine: starting, running (with the layout it runs on),
    resharding (the layout it relaunches on), completed, paused, failed, cancelled."""

    type: ClassVar[str] = "state"
    state: str
    world_size: int | None = None
    device: str | None = None
    dtype: str | None = None
    strategy: str | None = None
    params: int | None = None
    parallel: dict | None = None  # resharding: the new layout
    micro_batch: int | None = None  # resharding: the micro-batch that keeps the global batch
    error: str | None = None  # failed
    reason: str | None = None  # cancelled; a warm pause that turned cold
    mode: str | None = None  # paused (and running again after it): a PauseMode
    traceback: str | None = None


@dataclass(kw_only=True)
class StepEvent(Event):
    """One optimizer step, reduced over the ranks (memory and step time: the worst rank)."""

    type: ClassVar[str] = "step"
    loss: float
    grad_norm: float
    lr: float
    tokens_per_s: float
    step_time: float
    tokens: int
    memory: dict
    eval_loss: float | None = None
    state_bytes: dict | None = None
    comm: dict | None = None
    system: dict | None = None  # per metric one value per rank: CPU, RSS, GPU memory and use
    # per source of the mixture, keyed by its name: tokens seen so far and this step's loss
    source_tokens: dict | None = None
    source_loss: dict | None = None
    eval_source_loss: dict | None = None  # held-out loss per source, at an evaluation


@dataclass(kw_only=True)
class OpsEvent(Event):
    """Per-op timings of one step across ranks (engine.xputimer.aggregate)."""

    type: ClassVar[str] = "ops"
    step_ms: float
    void_share: float
    data_wait_share: float
    ops: dict
    ranks: list


@dataclass(kw_only=True)
class ExpertsEvent(Event):
    """Routing balance of every MoE layer at one step (moe.md section 8)."""

    type: ClassVar[str] = "experts"
    layers: list


class AnomalyKind(StrEnum):
    """What an `anomaly` event found: the engine's detectors' kinds (engine.anomaly, each
    answered by a rung of the fault ladder), then those only reported."""

    NAN = "nan"
    LOSS_SPIKE = "loss_spike"
    GRAD_SPIKE = "grad_spike"
    THROUGHPUT_DROP = "throughput_drop"
    STRAGGLER = "straggler"
    HANG = "hang"
    EXPERT_COLLAPSE = "expert_collapse"
    MEMORY_GROWTH = "memory_growth"
    CRASH = "crash"
    SDC_SUSPECT = "sdc_suspect"
    # reported only: a host the platform lost (its ranks restart elsewhere), a checkpoint that
    # failed its checksums on load (the next older one is loaded instead)
    HOST_LOST = "host_lost"
    CHECKPOINT_CORRUPT = "checkpoint_corrupt"


@dataclass(kw_only=True)
class AnomalyEvent(Event):
    """What a detector found; `rank` None for a global signal."""

    type: ClassVar[str] = "anomaly"
    kind: str
    severity: str
    rank: int | None = None  # None: a global signal (the reduced loss), no single rank
    evidence: dict = field(default_factory=dict)


class ActionBy(StrEnum):
    POLICY = "policy"  # the engine's fault ladder
    COMMAND = "command"  # a command from a person or the platform


class ActionName(StrEnum):
    """What an `action` event did: a rung of the fault ladder (weakest to strongest, the order
    engine.anomaly.policy ranks them in), a command carried out (its kind), or a command
    refused."""

    OBSERVE = "observe"
    RESUME = "resume"
    REBALANCE = "rebalance"
    RERUN = "rerun"
    SKIP_UPDATE = "skip_update"
    RETRY_STEP = "retry_step"
    LR_CUT = "lr_cut"
    CHECKPOINT = "checkpoint"
    ROLLBACK = "rollback"
    RESHARD = "reshard"
    EXCLUDE = "exclude"
    RESTART = "restart"
    PAUSE = "pause"
    CANCEL = "cancel"
    SET = "set"
    DECIDE = "decide"
    REFUSED = "refused"


@dataclass(kw_only=True)
class ActionEvent(Event):
    """Something done to the run: by the fault policy (naming the anomaly and its rung) or
    for a command (naming its id), or a command refused (`action` "refused", with `error`).
    What the action did (a checkpoint's path, the steps of a rollback) is in `details`."""

    type: ClassVar[str] = "action"
    action: str
    by: str | None = None
    command: str | None = None
    kind: str | None = None  # a refused command's kind
    anomaly: str | None = None
    rung: int | None = None
    rank: int | None = None
    reason: str | None = None
    error: str | None = None

    @property
    def refused(self) -> bool:
        return self.action == ActionName.REFUSED


class Choice(StrEnum):
    """`decide` args `choice`: take the proposed action, take `args.action` instead, or
    neither (observe)."""

    APPROVE = "approve"
    CHOOSE = "choose"
    DISMISS = "dismiss"


class ProposalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    CHOSEN = "chosen"  # a person chose another action
    DISMISSED = "dismissed"
    TIMED_OUT = "timed_out"  # nobody answered by the deadline: the policy's default was taken


@dataclass(kw_only=True)
class ProposalEvent(Event):
    """An action of the fault ladder that waits for a person (`faults.policy.approve`): sent
    `pending` with the anomaly's evidence, the wall-clock `deadline` and the `default` taken
    then, and again once it is decided, with the action taken (`take`) and who decided `by`
    (a person's `decide` command, naming its id, or the timeout). `hold`: whether the ranks
    wait at the step boundary meanwhile (else they train on, observing). The ladder also
    raises one itself when no rung that can help remains (`reason` says "needs attention"
    and which rungs were skipped): the run trains on as it is, `default` "observe"."""

    type: ClassVar[str] = "proposal"
    id: str
    status: str
    action: str
    anomaly: str
    deadline: float
    default: str
    hold: bool
    rank: int | None = None
    evidence: dict = field(default_factory=dict)
    take: str | None = None
    by: str | None = None
    command: str | None = None
    reason: str | None = None


class RerunCause(StrEnum):
    """What the fault policy's `rerun` found: trained again on the same data from the same
    state, the spike came back (the data: the batch is skipped and recorded in a `bad_batch`
    event) or did not (the step: it goes on with the rerun's result, and the ranks whose
    results differed are `sdc_suspect` anomalies). The `action` event's `cause`."""

    DATA = "data"
    STEP = "step"


@dataclass(kw_only=True)
class BadBatchEvent(Event):
    """A batch that makes a spike again when it is trained on again (the `rerun` rung): its
    samples, skipped. `samples`: the global sample indices (the loader's stream positions) of
    the spiking ranks' part of the step; `windows`: the dataset windows they are (tokens
    window x seq_len onwards); `ranks`: the ranks that trained on them; `evidence`: each
    rank's loss, first and again."""

    type: ClassVar[str] = "bad_batch"
    anomaly: str
    ranks: list
    samples: list
    windows: list
    evidence: dict = field(default_factory=dict)


class CheckpointTier(StrEnum):
    """Where a checkpoint (its `checkpoint` event's `tier`) is kept: this host's RAM (fast,
    lost with the host) or the disk or object store (checkpoint_dir)."""

    MEMORY = "memory"
    DISK = "disk"


@dataclass(kw_only=True)
class CheckpointEvent(Event):
    type: ClassVar[str] = "checkpoint"
    path: str
    tier: str  # "disk" or "memory"
    blocking_s: float
    size_bytes: int
    strategy: str
    world_size: int
    lineage: dict | None = None  # what made it: engine.runtime.lineage


@dataclass(kw_only=True)
class MembershipEvent(Event):
    """The set of hosts a multi-host job runs on changed: a host was lost, drained or came
    back. Published by the platform, which owns placement; the next incarnation of the ranks
    runs on `hosts_after` with `world_size` ranks, resharded from the newest checkpoint."""

    type: ClassVar[str] = "membership"
    hosts_before: list
    hosts_after: list
    world_size: int
    reason: str


@dataclass(kw_only=True)
class EvaluationEvent(Event):
    """A checkpoint's evaluation finished (the platform's jobs.evaluations), at the
    checkpoint's step. Published by the platform after the newest event, as entry
    `<seq>-<n>` with n > 0 (seq: that newest event's), so the engine's next `<seq+1>-0`
    still follows it, and the job's sinks read it from the stream as any other."""

    type: ClassVar[str] = "evaluation"
    evaluation: int
    checkpoint: str  # its path
    heldout: dict  # {source: {"loss", "perplexity", "windows"}}
    tasks: dict  # {task: {score: value}}: exact_match, loglik, accuracy, items


@dataclass(kw_only=True)
class LogEvent(Event):
    type: ClassVar[str] = "log"
    level: str
    message: str


EVENT_CLASSES: dict[str, type[Event]] = {
    cls.type: cls for cls in (StateEvent, StepEvent, OpsEvent, ExpertsEvent, AnomalyEvent,
                              ActionEvent, CheckpointEvent, MembershipEvent,
                              LogEvent, ProposalEvent, BadBatchEvent, EvaluationEvent)
}
EVENT_TYPES = tuple(EVENT_CLASSES)


def parse_event(data: Any) -> Event:
    """The typed event for a wire dict; ContractError naming the field if it is malformed or
    of an unknown type."""
    if not isinstance(data, dict):
        raise ContractError("event", "must be a JSON object")
    cls = EVENT_CLASSES.get(data.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise ContractError("type", f"unknown event type {data.get('type')!r}; "
                            f"known: {', '.join(EVENT_TYPES)}")
    return cls.from_dict(data)


# -- the bus -------------------------------------------------------------------------------

def events_stream(job: str) -> str:
    """The Redis stream of a job's events; event `seq` is entry `<seq>-0` (`stream_entry`)."""
    return f"ringside:job:{job}:events"


def entry_id(seq: int, n: int = 0) -> str:
    """The stream entry id of event `seq` (n 0), or of the n-th entry the platform appended
    after it (an evaluation's results): `<seq>-<n>`, so the engine's event seq+1 still follows."""
    return f"{seq}-{n}"


def entry_seq(id: bytes | str) -> tuple[int, int]:
    """(seq, n) of a stream entry id (`entry_id`), as a Redis client hands it back."""
    seq, n = (id.decode() if isinstance(id, bytes) else id).split("-")
    return int(seq), int(n)


class StreamField(StrEnum):
    """The fields of an event's entry on its job's stream."""

    EVENT = "event"  # the wire form, JSON
    # the event's type once more, outside the JSON: a reader that takes a few types (a metric
    # sink) passes the rest (per-op timings, expert loads: most of a run's bytes) unparsed
    TYPE = "type"


def stream_entry(type: str, wire_json: str) -> dict[str, str]:
    """The fields of an event's stream entry."""
    return {StreamField.TYPE: type, StreamField.EVENT: wire_json}


def entry_field(fields: dict | None, name: StreamField) -> bytes | str | None:
    """A field of a stream entry as a Redis client hands it back (bytes keys unless it decodes
    responses); None if the entry lacks it (an entry written before the field was)."""
    fields = fields or {}
    return fields.get(name.encode()) or fields.get(name.value)


def control_stream(job: str) -> str:
    """The Redis stream of a job's commands, JSON in the entry's `command` field."""
    return f"ringside:job:{job}:control"


# -- checkpoints ---------------------------------------------------------------------------

def is_url(location: str | Path) -> bool:
    """Whether a checkpoint location is a URL (`s3://bucket/prefix`) rather than a local path.
    A URL stays a str here (this module is stdlib-only); engine.checkpoint.store reads it."""
    found = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]+)://", str(location))
    return found is not None and found.group(1).lower() != "file"


def checkpoint_dir(configured: str, run_dir: Path) -> Path | str:
    """Where a run keeps its disk checkpoints: `checkpoint.dir` (a path, or a URL such as
    `s3://bucket/prefix`, returned as the str it is), else `<run dir>/checkpoints`."""
    if not configured:
        return run_dir / "checkpoints"
    return configured if is_url(configured) else Path(configured.removeprefix("file://"))


def memory_dir(directory: str | Path, host: str | None = None) -> Path:
    """The memory-tier folder of a checkpoint directory: the same on every restart. It is
    always local (RAM on this host), also for a URL, whose folder is keyed by the URL, and
    by the worker host's name where one is set (`host`, by default RINGSIDE_HOST_NAME): hosts
    emulated on one machine share its /dev/shm, yet each must hold only its own memory tier."""
    text = str(directory)
    key = hashlib.sha1((text if is_url(text) else str(Path(text).resolve())).encode())
    if host := host or os.environ.get("RINGSIDE_HOST_NAME"):
        key.update(f"@{host}".encode())
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return root / f"ringside-ckpt-{key.hexdigest()[:16]}"


def checkpoint_tiers(directory: str | Path) -> list[Path | str]:
    """Where a run's checkpoints may be, fastest first: the memory tier, then the disk (or the
    object store)."""
    return [memory_dir(directory), directory if is_url(directory) else Path(directory)]


# -- evaluations ---------------------------------------------------------------------------

# what `python -m engine.evaluate` writes into its output folder once every item is scored:
# its summary (items_total, items_done, heldout, tasks, generations, checkpoint, step)
EVALUATION_RESULTS = "results.json"
