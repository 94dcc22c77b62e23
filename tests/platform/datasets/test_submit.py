"""A job's mixture of datasets at submit (datasets.mix through jobs.confinement and
jobs.admission): `{"dataset": ID or name, "weight": w}` becomes the engine's `{"path": <prepared
folder>, "weight", "name"}`, its engine may read that folder, and a job is refused with a 400
naming the field when a dataset is missing, someone else's, not prepared, out of the model's
vocabulary, too small for one step's batch or its held-out split too small to evaluate."""

from __future__ import annotations

import copy

import pytest

from datasets.models import Dataset, DatasetState, split_counts
from engine.data.loader import training_data
from engine.data.prepare import prepare
from engine.data.sources import SourceSpec
from engine.errors import DataError
from engine.runtime.spec import parse_spec
from jobs.confinement import engine_roots
from jobs.models import Job
from tests.engine.data.test_prepare import corpus
from tests.platform.services import SMALL_SPEC

pytestmark = pytest.mark.django_db


def spec_with(*mix: dict, model: dict | None = None, **train) -> dict:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["train"].update(train, data={"mix": list(mix)})
    spec["model"].update(model or {})
    return spec


def errors_of(client, spec: dict) -> dict[str, str]:
    answer = client.post("/api/jobs/", spec, format="json")
    assert answer.status_code == 400, answer.json()
    assert not Job.objects.exists()
    return answer.json()["errors"]


def test_a_mix_of_datasets_is_resolved_to_their_prepared_folders(api, user, prepared):
    web, code = prepared(user, "web", vocab_size=300), prepared(user, "code")
    answer = api.post("/api/jobs/", spec_with({"dataset": "web", "weight": 3},
                                              {"dataset": code.pk}), format="json")
    assert answer.status_code == 201, answer.json()
    stored = answer.json()["spec"]
    assert stored["train"]["data"]["mix"] == [
        {"path": web.folder, "weight": 3.0, "name": "web"},
        {"path": code.folder, "weight": 1.0, "name": "code"}]
    assert stored["model"]["vocab_size"] == 300  # the larger tokenizer's, unless set
    job = Job.objects.get()
    assert {web.folder, code.folder} <= set(engine_roots(job))
    assert set(web.active_jobs()) == {job} == set(code.active_jobs())


def test_a_clone_carries_the_folders_it_may_still_read(api, user, prepared):
    prepared(user, "web")
    job_id = api.post("/api/jobs/", spec_with({"dataset": "web"}), format="json").json()["id"]
    clone = api.post(f"/api/jobs/{job_id}/clone/", {}, format="json")
    assert clone.status_code == 201, clone.json()


def test_missing_and_other_users_datasets_are_refused_alike(api, other_user, prepared):
    bobs = prepared(other_user, "bobs")
    for ref in ("bobs", bobs.pk, "nothing", 999):
        assert errors_of(api, spec_with({"dataset": ref})) == {
            "train.data.mix.0.dataset": f"no dataset {ref!r} of yours or shared"}
    bobs.shared = True
    bobs.save()
    assert api.post("/api/jobs/", spec_with({"dataset": "bobs"}),
                    format="json").status_code == 201


def test_a_server_path_in_the_mix_is_refused(api, user, prepared, tmp_path):
    prepared(user, "web")
    for entry in ({"path": str(tmp_path)}, {"path": "/etc"}, {"dataset": None}, "web"):
        assert list(errors_of(api, spec_with(entry))) == ["train.data.mix.0.dataset"], entry


def test_a_dataset_not_prepared_is_refused_naming_its_state(api, user, prepared):
    web = prepared(user, "web")
    for state in (DatasetState.REGISTERED, DatasetState.PREPARING, DatasetState.FAILED):
        web.state = state
        web.save()
        assert errors_of(api, spec_with({"dataset": "web"})) == {
            "train.data.mix.0.dataset": f"dataset 'web' is {state}: prepare it first"}


def test_a_vocabulary_larger_than_the_models_is_refused(api, user, prepared):
    prepared(user, "web", vocab_size=50_000)
    assert errors_of(api, spec_with({"dataset": "web"}, model={"vocab_size": 256})) == {
        "model.vocab_size": "must be at least 50000, the vocabulary of dataset 'web''s "
                            "tokenizer (leave it out to follow the tokenizer)"}


def test_a_dataset_smaller_than_one_steps_batch_is_refused(api, user, prepared):
    prepared(user, "web", train=64)  # SMALL_SPEC: 2 windows of 32 tokens (+1) a step
    assert errors_of(api, spec_with({"dataset": "web"})) == {
        "train.data.mix.0.dataset": "dataset 'web' holds 64 training tokens, fewer than one "
                                    "step's batch (2 windows of train.seq_len 32 + 1)"}


def test_a_held_out_split_smaller_than_one_evaluation_batch_is_refused_naming_holdout(
        api, user, prepared):
    prepared(user, "web", heldout=40)
    assert api.post("/api/jobs/", spec_with({"dataset": "web"}),  # eval_every 0: no evaluation
                    format="json").status_code == 201
    Job.objects.all().delete()
    errors = errors_of(api, spec_with({"dataset": "web"}, eval_every=3))
    assert errors == {"train.data.mix.0.dataset": (
        "dataset 'web''s held-out split holds 40 tokens, fewer than one evaluation batch "
        "(2 windows of train.seq_len 32 + 1): register it with a larger holdout than 0.01")}


def test_the_platform_refuses_a_dataset_exactly_when_the_engine_would(api, user, tmp_path):
    """At the edge of one step's batch and of one evaluation batch, on 2 ranks: the job the
    API admits is the job whose engine opens its data, and the one it refuses the engine
    refuses too (one rule, engine.data.needs, read from the manifest and from the shards)."""
    corpus(tmp_path / "src", documents=10, words=20)
    folder = str(tmp_path / "web")
    manifest = prepare([SourceSpec("text", [str(tmp_path / "src" / "*.txt")])], "bytes", folder,
                       holdout=0.2, workers=1)
    Dataset.objects.create(owner=user, name="web", state=DatasetState.READY, holdout=0.2,
                           sources=[], manifest=manifest, folder=folder)
    train, heldout = (split_counts(manifest, s)["tokens"] for s in ("train", "heldout"))
    batch = 2 * 2  # micro_batch x ranks: one evaluation batch, a step's at grad_accum 1
    edges = {(train - 1) // batch: 0, (heldout - 1) // batch: 1}  # seq_len: eval_every
    decided = []
    for seq_len, eval_every in [(s + past, e) for s, e in edges.items() for past in (0, 1)]:
        spec = spec_with({"dataset": "web"}, seq_len=seq_len, eval_every=eval_every)
        spec["parallel"] = {"nodes": 1, "procs_per_node": 2}
        admitted = api.post("/api/jobs/", spec, format="json").status_code == 201
        spec["train"]["data"]["mix"] = [{"path": folder, "weight": 1.0, "name": "web"}]
        try:
            training_data(parse_spec(spec), rank=0, world_size=2)
            opened = True
        except DataError:
            opened = False
        decided.append((seq_len, eval_every, admitted, opened))
    assert [(admitted, opened) for *_, admitted, opened in decided] == [
        (True, True), (False, False)] * 2, decided
