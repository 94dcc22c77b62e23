"""What a job needs of the datasets its spec mixes (`train.data.mix` names registered datasets):
the `datasets` app, which builds on this one, provides it when it is ready (datasets.apps), so
jobs imports no module of datasets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from common.provided import Provided

if TYPE_CHECKING:
    from engine.runtime.spec import JobSpec
    from jobs.models import Job


class Mixtures(Protocol):
    def resolve(self, data: dict[str, Any], user: Any, errors: dict[str, str]) -> None:
        """`data`'s mixture (a platform spec, changed in place) as the engine takes it, naming
        the datasets' folders; what cannot be resolved is added to `errors` by dotted field."""

    def spec_errors(self, spec: JobSpec) -> dict[str, str]:
        """What the mixed datasets make of a parsed spec (a vocabulary it lacks, too few
        tokens), by dotted field."""

    def folders(self, job: Job) -> list[str]:
        """The prepared folders of `job`'s datasets its owner may still read."""

    def record_use(self, job: Job) -> None:
        """Mark `job`'s datasets as in use by it."""


mixtures: Provided[Mixtures] = Provided("dataset mixtures (the datasets app)")
