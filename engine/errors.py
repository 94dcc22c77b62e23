"""The validation error of the job spec, in a module of its own so that the parts of the spec
that other packages own (the fault policy, in engine.anomaly) raise it without importing the
runtime."""

from __future__ import annotations


class SpecError(ValueError):
    """A spec failed validation; `errors` maps each bad field's dotted path to a message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(sorted(errors.items()))
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.errors.items()))
