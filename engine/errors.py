"""The configuration errors: the job spec's validation, and what the engine finds wrong with the
spec or its data when a run starts (a glob that matches nothing, a missing tokenizer, too little
data, a vocabulary larger than the model's). In a module of their own so that the parts of the
spec that other packages own (the fault policy, in engine.anomaly) raise them without importing
the runtime."""

from __future__ import annotations


class ConfigError(ValueError):
    """The job's configuration cannot run; the message names the spec field at fault. Running
    it again cannot help, so the launcher fails the job at once instead of restarting it."""


class SpecError(ConfigError):
    """A spec failed validation; `errors` maps each bad field's dotted path to a message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(sorted(errors.items()))
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.errors.items()))


class DataError(ConfigError):
    """A dataset could not be prepared or read; the message names the spec field at fault (or
    the file, for a prepared dataset that is corrupt or incomplete)."""
