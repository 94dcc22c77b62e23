"""The loader over a mixture: every row from its source, exact shares, exact resume at any
world size (with live weight changes), windows across epochs, document ids, and the job's
data refused at start naming the field."""

import pytest
import torch

from engine.data.loader import TokenLoader, training_data
from engine.data.span import MixSource, TensorSpan
from engine.runtime.data import DataError
from engine.runtime.spec import parse_spec

SEQ = 16


def source(name: str, weight: float, first: int, tokens: int, doc_every: int = 0) -> MixSource:
    """Tokens first .. first+tokens: a row's values say which source and window it is."""
    starts = torch.arange(0, tokens, doc_every) if doc_every else None
    span = TensorSpan(torch.arange(first, first + tokens), starts)
    return MixSource(name=name, weight=weight, train=span, heldout=span, vocab_size=0, eod=None)


def mixture(weights=(0.6, 0.3, 0.1)) -> list[MixSource]:
    return [source(f"s{i}", w, i * 1_000_000, 4000 + 1000 * i) for i, w in enumerate(weights)]


def steps(loaders: list[TokenLoader], count: int, grad_accum: int = 1) -> list[list[int]]:
    """Each step's rows (their first token) over all ranks, in global sample order."""
    out = []
    for _ in range(count):
        step = []
        for micro in range(grad_accum):
            parts = [loader.next_batch(micro)[0][:, 0].tolist() for loader in loaders]
            step += [row for part in parts for row in part]
        out.append(step)
    return out


def loaders(world: int, micro_batch: int, sources=None, grad_accum: int = 1) -> list[TokenLoader]:
    return [TokenLoader(sources or mixture(), SEQ, micro_batch, rank, world, seed=3,
                        grad_accum=grad_accum) for rank in range(world)]


def test_every_row_is_a_window_of_its_source_and_the_shares_follow_the_weights():
    (loader,) = loaders(1, 8)
    rows = 0
    seen = torch.zeros(3)
    for _ in range(200):
        batch = loader.next_micro_batch()
        owner = batch.input_ids[:, 0] // 1_000_000
        assert torch.equal(owner, batch.sources)
        assert torch.equal(batch.labels[:, :-1], batch.input_ids[:, 1:])
        assert ((batch.input_ids[:, 0] % 1_000_000) % SEQ == 0).all()  # window starts
        seen += torch.bincount(batch.sources, minlength=3)
        rows += len(batch.sources)
    assert ((seen / rows - torch.tensor([0.6, 0.3, 0.1])).abs() / torch.tensor(
        [0.6, 0.3, 0.1])).max() < 0.01


def test_each_epoch_of_a_source_visits_every_window_once_in_a_new_order():
    small = [source("a", 0.5, 0, 8 * SEQ + 1), source("b", 0.5, 1_000_000, 64 * SEQ + 1)]
    (loader,) = loaders(1, 4, small)
    firsts = [row for step in steps([loader], 8) for row in step if row < 1_000_000]
    epochs = [firsts[i:i + 8] for i in range(0, 16, 8)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(0, 8 * SEQ, SEQ))
    assert epochs[0] != epochs[1]


def test_a_resume_at_another_world_size_gives_the_uninterrupted_sequence():
    straight = steps(loaders(1, 8, grad_accum=2), 30, grad_accum=2)
    first = loaders(2, 4, grad_accum=2)
    before = steps(first, 11, grad_accum=2)
    state = first[0].state_dict()
    resumed = loaders(4, 2, grad_accum=2)
    for loader in resumed:
        loader.load_state_dict(state)
    assert before + steps(resumed, 19, grad_accum=2) == straight


def test_a_live_weight_change_applies_from_the_next_sample_and_resumes_exactly():
    def changed(world: int, micro: int) -> list[TokenLoader]:
        group = loaders(world, micro)
        for loader in group:
            loader.position = 0
        return group

    straight = changed(1, 8)
    before = steps(straight, 5)
    straight[0].set_weights([0.1, 0.1, 0.8])
    after = steps(straight, 40)
    rows = [row for step in after for row in step]
    shares = torch.bincount(torch.tensor(rows) // 1_000_000, minlength=3) / len(rows)
    assert shares.tolist() == pytest.approx([0.1, 0.1, 0.8], abs=0.01)

    group = changed(2, 4)
    assert steps(group, 5) == before
    for loader in group:
        loader.set_weights([0.1, 0.1, 0.8])
    part = steps(group, 7)
    state = group[1].state_dict()
    resumed = changed(4, 2)
    for loader in resumed:
        loader.load_state_dict(state)
    assert part + steps(resumed, 33) == after


def test_skipping_data_on_rollback_is_moving_the_position():
    (straight,) = loaders(1, 4)
    sequence = steps([straight], 10)
    (skipping,) = loaders(1, 4)
    steps([skipping], 2)
    skipping.position += 4 * 5  # five steps' windows are not trained on
    assert steps([skipping], 3) == sequence[7:10]


def test_document_ids_number_the_documents_of_each_row():
    docs = [source("d", 1.0, 0, 40 * SEQ, doc_every=5)]
    loader = TokenLoader(docs, SEQ, 4, 0, 1, seed=1, document_mask=True)
    batch = loader.next_micro_batch()
    for tokens, ids in zip(batch.input_ids, batch.doc_ids, strict=True):
        expected = torch.cumsum((tokens % 5 == 0).long(), 0)  # a document starts at k*5
        expected -= expected[0].clone()
        assert torch.equal(ids, expected)
    assert TokenLoader(docs, SEQ, 4, 0, 1, seed=1).next_micro_batch().doc_ids is None


def job(tmp_path, **train) -> dict:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    return {"name": "d", "model": {"preset": "nano"},
            "train": {"seq_len": 32, "micro_batch": 2, "eval_every": 10,
                      "dataset": {"kind": "text", "paths": [str(corpus)]}, **train}}


def test_the_jobs_data_is_refused_at_start_naming_the_field(tmp_path):
    loader = training_data(parse_spec(job(tmp_path, dataset={
        "kind": "text", "paths": [str(tmp_path / "corpus.txt")], "holdout": 0.2})), 0, 2)
    assert loader.names == ["dataset"] and loader.world_size == 2
    with pytest.raises(DataError, match=r"^train\.dataset\.holdout: .*evaluation batch"):
        training_data(parse_spec(job(tmp_path)), rank=0, world_size=2)
    small = job(tmp_path, seq_len=16384)
    small["model"]["max_position_embeddings"] = 16384
    with pytest.raises(DataError, match=r"^train\.dataset\.paths: .*one window"):
        training_data(parse_spec({**small, "train": {**small["train"], "eval_every": 0}}), 0, 1)
    narrow = job(tmp_path, eval_every=0)
    narrow["model"]["vocab_size"] = 128
    with pytest.raises(DataError, match=r"^model\.vocab_size: 128"):
        training_data(parse_spec(narrow), rank=0, world_size=1)
