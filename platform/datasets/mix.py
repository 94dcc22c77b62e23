"""A job's mixture of datasets (`train.data.mix`), from the platform's spec to the engine's.

A user's spec names datasets, `[{"dataset": ID or name, "weight": w}]`; at submit each is
resolved to the engine's entry `{"path": <prepared folder>, "weight": w, "name": <its name>}`
(a stored spec, as a clone carries it, names the folder of a dataset the user may read). The
model's vocab_size follows the datasets' tokenizer unless the spec sets it. What the parsed
spec asks of the data is checked before the job queues (`spec_errors`): a vocabulary the model
holds, one step's batch of training tokens, one evaluation batch of held-out ones. The job's
engine may read the folders of its datasets (`folders`), and a dataset a job trains on is
kept while it runs (`record_use`).
"""

from __future__ import annotations

from typing import Any

from datasets.models import Dataset, DatasetState, split_counts, visible_datasets
from engine.runtime.spec import JobSpec, SourceSize, data_errors
from jobs.models import Job

UNRESOLVED = "<unresolved>"
ENTRY = '{"dataset": ID or name, "weight": w}: one of your datasets or a shared one'


def _find(ref: Any, user: Any) -> Dataset | str:
    """The dataset `ref` (an id or a name) names among those `user` may read, or why not: the
    same words whether another user's exists or not."""
    visible = visible_datasets(user)
    if isinstance(ref, int) and not isinstance(ref, bool):
        found = visible.filter(pk=ref).first()
    elif isinstance(ref, str) and ref:
        named = visible.filter(name=ref)
        found = named.filter(owner=user).first() or named.first()
        if found is not None and found.owner != user and named.count() > 1:
            return f"several shared datasets are named {ref!r}: name one by its id"
    else:
        return ENTRY
    return found if found is not None else f"no dataset {ref!r} of yours or shared"


def _entry(entry: Any, user: Any) -> Dataset | str:
    if not isinstance(entry, dict) or set(entry) - {"dataset", "weight", "path", "name"}:
        return ENTRY
    if "dataset" in entry:
        return _find(entry["dataset"], user)
    found = visible_datasets(user).filter(folder=entry.get("path") or None).first()
    return found if found is not None else ENTRY


def resolve(data: dict[str, Any], user: Any, errors: dict[str, str]) -> None:
    """`data`'s `train.data.mix` (a platform spec, changed in place) as the engine takes it;
    what cannot be resolved is added to `errors` by dotted field."""
    train = data.get("train")
    section = train.get("data") if isinstance(train, dict) else None
    mix = section.get("mix") if isinstance(section, dict) else None
    if not isinstance(mix, list) or not mix:
        return
    vocab = []
    for i, entry in enumerate(mix):
        found = _entry(entry, user)
        error = _unusable(found, mix[:i])
        weight = entry.get("weight", 1.0) if isinstance(entry, dict) else 1.0
        if error is not None:
            errors[f"train.data.mix.{i}.dataset"] = error
            # the engine's parse then names only what else is wrong (a weight), not this
            mix[i] = {"path": UNRESOLVED, "weight": weight}
        else:
            mix[i] = {"path": found.folder, "weight": weight, "name": found.name}
            vocab.append(found.vocab_size)
    model = data.get("model")
    if vocab and isinstance(model, dict) and "vocab_size" not in model:
        model["vocab_size"] = max(vocab)


def _unusable(found: Dataset | str, before: list[dict]) -> str | None:
    """Why the dataset found for a mix entry cannot be trained on; None when it can."""
    if isinstance(found, str):
        return found
    if found.state != DatasetState.READY:
        return f"dataset {found.name!r} is {found.state}: prepare it first"
    if any(e.get("name") == found.name for e in before):
        return f"dataset {found.name!r} is in the mix already"
    return None


def _sizes(spec: JobSpec) -> list[SourceSize]:
    """The spec's mix entries that name a dataset, as the data rule sees each (by the field
    the user set: its `dataset`)."""
    by_folder = {d.folder: d for d in Dataset.objects.filter(
        folder__in=[e.path for e in spec.train.data.mix])}
    return [SourceSize(d.name, f"train.data.mix.{i}.dataset", d.vocab_size or 0,
                       split_counts(d.manifest, "train")["tokens"],
                       split_counts(d.manifest, "heldout")["tokens"],
                       holdout_hint=f"register it with a larger holdout than {d.holdout:g}")
            for i, e in enumerate(spec.train.data.mix) if (d := by_folder.get(e.path))]


def spec_errors(spec: JobSpec) -> dict[str, str]:
    """What the job's datasets cannot give the parsed `spec`, by field (engine.data.needs, the
    rule the engine applies again at start), with what the user can do about it."""
    errors = data_errors(spec, _sizes(spec), spec.parallel.world_size)
    if "model.vocab_size" in errors:  # at submit the tokenizer's is the default
        errors["model.vocab_size"] += " (leave it out to follow the tokenizer)"
    return errors


def folders(job: Job) -> list[str]:
    """The prepared folders of `job`'s datasets its owner may still read (its engine's
    roots)."""
    paths = [e.get("path") for e in job.spec.get("train", {}).get("data", {}).get("mix", [])]
    return list(visible_datasets(job.owner).filter(folder__in=[p for p in paths if p])
                .values_list("folder", flat=True))


def record_use(job: Job) -> None:
    """Mark `job`'s datasets as in use by it (a dataset in use is not deleted)."""
    paths = [e["path"] for e in job.spec.get("train", {}).get("data", {}).get("mix", [])]
    for dataset in Dataset.objects.filter(folder__in=paths):
        dataset.used_by.add(job)
