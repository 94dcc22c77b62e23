"""Live hyper-parameters: what a `set` command may change in a running job, validated as the
spec validates it, applied at a step boundary on every rank, and kept in the train state.

A change is a flat object of dotted spec keys, `{"train.lr": 1e-3, "checkpoint.every": 20}`.
`validate_settings` (engine.runtime.spec, beside the rules it applies) checks every key and
value (the platform calls it before a command is stored) and raises SpecError naming each bad
field. `LiveSettings` holds
the run's effective values: the spec's, with the changes over them. The loop reads the train
fields from the spec object it shares with this component; the parts that copied a value at
construction (the optimizer's weight decay, the checkpointer's schedule, the fault policy) are
told of each change.

`train.lr` is the schedule's peak, `train.lr_factor` (not a spec field) multiplies the
schedule from now on. `train.data.mix_weights` (a list, one weight per source of the mixture,
in the order of `train.data.mix`; one for a single dataset) blends the sources at new weights
from the next sample on (engine.data.blend keeps the change in the loader's state).
The fault policy's `thresholds` and `actions` are replaced whole.

The changes in force also live in the run folder (`SETTINGS_LOG`, rank 0's, rewritten at each
change and rollback): a checkpoint holds the changes made before it, so ranks restarted from
an older one (a crash, the policy's restart, a relaunch after a lost worker) would lose the
later ones; `carry_over` applies the log again after such a resume.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from engine.anomaly.policy import FaultPolicy
from engine.errors import SpecError
from engine.runtime.spec import LR_FACTOR, MIX_WEIGHTS, JobSpec, launched_values, validate_settings

SETTINGS_LOG = "live_settings.json"


def _set(spec: JobSpec, key: str, value: Any) -> None:
    parent, name = key.rsplit(".", 1)
    setattr(functools.reduce(getattr, parent.split("."), spec), name, value)


class HasWeightDecay(Protocol):
    def set_weight_decay(self, weight_decay: float) -> None: ...


class HasSchedule(Protocol):
    def set_schedule(self, every: int, keep: int, memory_every: int) -> None: ...


class HasPolicy(Protocol):
    def set_policy(self, policy: FaultPolicy) -> None: ...


class HasMixWeights(Protocol):
    names: list[str]  # the mixture's sources

    def set_weights(self, weights: list[float]) -> None: ...


class LiveSettings:
    """Every rank's. `spec` is the run's own (changed in place: the loop reads it);
    `checkpointer` is set once the run's exists (it saves this component in the train
    state, so it comes later); `loader` blends the mixture (None: the weights are not live)."""

    def __init__(self, spec: JobSpec, optimizer: HasWeightDecay, faults: HasPolicy,
                 loader: HasMixWeights | None = None):
        self.spec, self.optimizer, self.faults, self.loader = spec, optimizer, faults, loader
        self.checkpointer: HasSchedule | None = None
        self.launched = launched_values(spec)
        self.lr_factor = 1.0
        self.overrides: dict[str, Any] = {}  # every key a `set` changed, at its latest value
        self.log: Path | None = None  # rank 0's SETTINGS_LOG; None on the other ranks

    def values(self) -> dict[str, Any]:
        """The effective value of every live setting."""
        return {**self.launched, **self.overrides}

    def change(self, changes: Any) -> dict[str, dict[str, Any]]:
        """Validate every key, then apply them all: `{key: {"old", "new"}}`. SpecError
        (nothing changed) naming every bad key."""
        new = validate_settings(changes)
        sources = len(self.loader.names) if self.loader is not None else 1
        if MIX_WEIGHTS in new and len(new[MIX_WEIGHTS]) != sources:
            raise SpecError({MIX_WEIGHTS: f"the mixture has {sources} sources, got "
                                          f"{len(new[MIX_WEIGHTS])} weights"})
        old = self.values()
        self.overrides.update(new)
        self._apply(new)
        self.record()
        return {key: {"old": old[key], "new": value} for key, value in new.items()}

    def _apply(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if key == LR_FACTOR:
                self.lr_factor = value
            elif key == MIX_WEIGHTS:
                if self.loader is not None:
                    self.loader.set_weights(value)
            else:
                _set(self.spec, key, value)
        if "train.weight_decay" in values:
            self.optimizer.set_weight_decay(values["train.weight_decay"])
        c = self.spec.checkpoint
        if self.checkpointer is not None and any(k.startswith("checkpoint.") for k in values):
            self.checkpointer.set_schedule(c.every, c.keep, c.memory_every)
        if any(k.startswith("faults.") for k in values):
            self.faults.set_policy(self.spec.faults.policy)

    def record(self) -> None:
        """Write the changes in force to the log (rank 0), whole and at once: a crash while it
        writes leaves the previous one."""
        if self.log is None:
            return
        partial = self.log.with_name(self.log.name + ".tmp")
        partial.write_text(json.dumps(self.overrides), encoding="utf-8")
        os.replace(partial, self.log)

    def state_dict(self) -> dict[str, Any]:
        return {"overrides": dict(self.overrides)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The saved changes over the spec as launched (a checkpoint from before any `set`
        has none: the spec's values come back)."""
        overrides = dict(state.get("overrides", {}))
        changed = {key: value for key, value in {**self.launched, **overrides}.items()
                   if value != self.values()[key]}
        self.overrides = overrides
        self._apply(changed)


def carry_over(settings: LiveSettings, resumed: bool,
               broadcast: Callable[[list[Any]], None]) -> dict[str, Any]:
    """After the checkpoint was loaded (`resumed`: from this run's own, or after a restart of
    the ranks): every rank takes rank 0's log of the changes in force and applies it over the
    checkpoint's; returns the values that changed. A fresh start drops a log left behind."""
    box: list[Any] = [None]
    if settings.log is not None and settings.log.exists():
        if resumed:
            box[0] = json.loads(settings.log.read_text(encoding="utf-8"))
        else:
            settings.log.unlink()
    broadcast(box)
    if box[0] is None:
        return {}
    before = settings.values()
    settings.load_state_dict({"overrides": box[0]})
    settings.record()
    return {key: value for key, value in settings.values().items() if value != before[key]}
