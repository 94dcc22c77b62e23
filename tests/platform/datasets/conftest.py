"""Datasets of ada (`api`), bob (`bob_api`) and staff (`staff_api`); a prepared one made directly
(its folder and manifest as a finished prepare leaves them), for the tests that only read it."""

from __future__ import annotations

import pytest

from datasets.models import Dataset, DatasetState, prepared_folder
from tests.platform.isolation.conftest import bob_api, client_of, staff, staff_api  # noqa: F401
from tests.platform.isolation.test_paths import outside_paths  # noqa: F401 (a fixture)
from tests.platform.ringside.test_client import ringside, token  # noqa: F401 (fixtures)


def manifest(vocab_size: int = 256, train: int = 100_000, heldout: int = 5_000) -> dict:
    return {"tokenizer": {"hash": "bytes", "vocab_size": vocab_size, "eod": vocab_size - 1},
            "splits": {"train": {"documents": 100, "tokens": train},
                       "heldout": {"documents": 5, "tokens": heldout}}}


@pytest.fixture
def prepared():
    """`prepared(owner, name, **manifest fields)`: a ready dataset of `owner`."""
    def make(owner, name: str = "web", shared: bool = False, **counts) -> Dataset:
        dataset = Dataset.objects.create(
            owner=owner, name=name, shared=shared, state=DatasetState.READY,
            sources=[{"kind": "text", "paths": ["/x/*.txt"], "field": "text"}],
            manifest=manifest(**counts))
        dataset.folder = prepared_folder(dataset.pk)
        dataset.save()
        return dataset
    return make
