"""engine.data.needs: what a spec needs of each source — a vocabulary the model holds, one
step's batch of training windows, one evaluation batch of held-out windows when it evaluates —
each refusal naming the field that chose the source and the numbers it fell short by."""

from __future__ import annotations

from engine.data.needs import SourceSize, data_errors, windows
from engine.runtime.spec import parse_spec

# micro_batch 2 on 2 ranks, grad_accum 3: a step is 12 windows, an evaluation batch 4
SPEC = parse_spec({"name": "t", "model": {"preset": "nano"}, "parallel": {"procs_per_node": 2},
                   "train": {"micro_batch": 2, "grad_accum": 3, "seq_len": 10,
                             "eval_every": 5}})


def size(train: int = 10_000, heldout: int = 10_000, vocab: int = 256, **fields) -> SourceSize:
    return SourceSize("web", "train.data.mix.0.path", vocab, train, heldout, **fields)


def test_windows_overlap_by_one_token():
    assert [windows(n, 10) for n in (0, 1, 10, 11, 20, 21)] == [0, 0, 0, 1, 1, 2]


def test_enough_for_a_step_and_an_evaluation_batch_is_enough():
    assert data_errors(SPEC, [size(train=12 * 10 + 1, heldout=4 * 10 + 1)], 2) == {}


def test_one_token_short_of_a_step_is_refused_naming_the_source():
    assert data_errors(SPEC, [size(train=12 * 10)], 2) == {
        "train.data.mix.0.path": "dataset 'web' holds 120 training tokens, fewer than one "
                                 "step's batch (12 windows of train.seq_len 10 + 1)"}


def test_the_held_out_split_counts_every_rank_and_only_when_the_job_evaluates():
    short = size(heldout=4 * 10, holdout_field="train.dataset.holdout", holdout_hint="raise it")
    assert data_errors(SPEC, [short], 2) == {
        "train.dataset.holdout": "dataset 'web''s held-out split holds 40 tokens, fewer than "
                                 "one evaluation batch (4 windows of train.seq_len 10 + 1): "
                                 "raise it"}
    assert data_errors(SPEC, [short], 1) == {}  # one rank: an evaluation batch is 2 windows
    quiet = parse_spec({**SPEC.to_dict(), "train": {**SPEC.to_dict()["train"], "eval_every": 0}})
    assert data_errors(quiet, [size(heldout=0)], 2) == {}


def test_a_tokenizer_wider_than_the_model_is_refused_on_vocab_size():
    unnamed = SourceSize("", "train.dataset.paths", 70_000, 10_000, 10_000)
    assert data_errors(SPEC, [size(), unnamed], 2) == {
        "model.vocab_size": "must be at least 70000, the vocabulary of the dataset's tokenizer"}
