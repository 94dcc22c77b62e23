"""The loader over a mixture: every row from its source, exact shares, exact resume at any
world size (with live weight changes), windows across epochs, document ids, and the job's
data refused at start naming the field."""

import re

import pytest
import torch

from engine.data.catalog import open_sources
from engine.data.loader import TokenLoader, training_data
from engine.data.span import MixSource, TensorSpan
from engine.errors import DataError
from engine.runtime.spec import parse_spec
from tests.engine.data.test_tokenizers import wide_tokenizer

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


def test_default_corpus_is_the_standard_library_source():
    [source] = open_sources(parse_spec({"name": "t"}))  # prepared on first use, then cached
    assert (source.vocab_size, source.eod) == (256, 0)
    assert len(source.train) > 1_000_000
    assert 0 < len(source.heldout) < len(source.train) // 20
    assert int(source.train.read(0, 1_000_000).max()) < 256


def test_a_tokenizer_wider_than_the_model_is_refused_naming_vocab_size(tmp_path):
    (tmp_path / "a.txt").write_text("w1 w2 w3 " * 100)
    spec = parse_spec({"name": "t", "model": {"preset": "nano"}, "train": {"dataset": {
        "kind": "text", "paths": [str(tmp_path / "a.txt")],
        "tokenizer": str(wide_tokenizer(tmp_path))}}})
    with pytest.raises(DataError, match=r"model\.vocab_size: must be at least 70000, the "
                                        r"vocabulary of the dataset's tokenizer"):
        training_data(spec, rank=0, world_size=1)


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
    with pytest.raises(DataError, match=r"^train\.dataset\.paths: .*one step's batch"):
        training_data(parse_spec({**small, "train": {**small["train"], "eval_every": 0}}), 0, 1)
    narrow = job(tmp_path, eval_every=0)
    narrow["model"]["vocab_size"] = 128
    with pytest.raises(DataError, match=r"^model\.vocab_size: must be at least 256"):
        training_data(parse_spec(narrow), rank=0, world_size=1)


# -- one source: the loader's position, ranks and shares -----------------------------------

def tokens(n=10_000):
    return torch.arange(n) % 251


def test_resuming_from_a_saved_position_gives_the_same_batches():
    straight = TokenLoader(tokens(), seq_len=16, micro_batch=4, rank=0, world_size=1, seed=7)
    expected = [straight.next_batch() for _ in range(400)]  # crosses epochs (624 windows)

    first = TokenLoader(tokens(), seq_len=16, micro_batch=4, rank=0, world_size=1, seed=7)
    for _ in range(150):
        first.next_batch()
    resumed = TokenLoader(tokens(), seq_len=16, micro_batch=4, rank=0, world_size=1, seed=7)
    resumed.load_state_dict(first.state_dict())
    for want in expected[150:]:
        got = resumed.next_batch()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_ranks_split_the_same_global_batch():
    whole = TokenLoader(tokens(), seq_len=16, micro_batch=4, rank=0, world_size=1, seed=3)
    halves = [TokenLoader(tokens(), seq_len=16, micro_batch=2, rank=r, world_size=2, seed=3)
              for r in range(2)]
    for _ in range(10):
        inputs, labels = whole.next_batch()
        parts = [h.next_batch() for h in halves]
        assert torch.equal(inputs, torch.cat([p[0] for p in parts]))
        assert torch.equal(labels[:, :-1], inputs[:, 1:])


def step_windows(loaders, grad_accum):
    """The windows each rank trains on in one step, by their first token."""
    return [[int(row[0]) for micro in range(grad_accum) for row in loader.next_batch(micro)[0]]
            for loader in loaders]


@pytest.mark.parametrize("shares, grad_accum", [([6, 6, 6, 6], 3), ([8, 8, 5, 3], 3),
                                                ([10, 7, 4, 3], 2), ([21, 1, 1, 1], 1)])
def test_any_shares_cover_the_balanced_steps_windows_each_once(shares, grad_accum):
    def ranks():
        return [TokenLoader(tokens(), seq_len=16, micro_batch=2 * 3 // grad_accum, rank=r,
                            world_size=4, seed=5, grad_accum=grad_accum) for r in range(4)]

    balanced, rebalanced = ranks(), ranks()
    for loader in rebalanced:
        loader.set_shares(shares)
    for _ in range(5):  # steps
        want = step_windows(balanced, grad_accum)
        got = step_windows(rebalanced, grad_accum)
        assert [len(w) for w in got] == shares
        assert sorted(sum(got, [])) == sorted(sum(want, []))
        assert rebalanced[0].position == balanced[0].position


def test_a_rebalanced_loader_resumes_with_its_shares_and_a_reshard_evens_them():
    loader = TokenLoader(tokens(), seq_len=16, micro_batch=2, rank=1, world_size=2, seed=5,
                         grad_accum=2)
    loader.set_shares([6, 2])
    loader.next_batch(0)
    state = loader.state_dict()
    resumed = TokenLoader(tokens(), seq_len=16, micro_batch=2, rank=1, world_size=2, seed=5,
                          grad_accum=2)
    resumed.load_state_dict(state)
    assert resumed.shares == [6, 2] and torch.equal(resumed.next_batch(1)[0],
                                                    loader.next_batch(1)[0])
    wider = TokenLoader(tokens(), seq_len=16, micro_batch=1, rank=1, world_size=4, seed=5,
                        grad_accum=2)
    wider.load_state_dict(state)
    assert wider.shares == [2, 2, 2, 2] and not wider.rebalanced


@pytest.mark.parametrize("shares, error", [
    ([4, 4, 4], "a list of 2 whole numbers"),
    ([4, 3], "sum to the global batch of 8"),
    ([7, 1], "at least 2 (one per micro-step)"),
    ([4.0, 4], "whole numbers"),
])
def test_shares_that_cannot_split_the_step_are_refused_naming_why(shares, error):
    loader = TokenLoader(tokens(), seq_len=16, micro_batch=2, rank=0, world_size=2, seed=5,
                         grad_accum=2)
    with pytest.raises(ValueError, match=re.escape(error)):
        loader.set_shares(shares)
    assert loader.shares == [4, 4]


def test_a_steps_samples_per_rank_are_those_its_batches_hold():
    tokens = torch.arange(4000)
    loaders = [TokenLoader(tokens, 8, 2, rank, 2, seed=1, grad_accum=2) for rank in (0, 1)]
    loaders[0].set_shares([3, 5])
    loaders[1].set_shares([3, 5])
    for loader in loaders:
        loader.position = 16
    for rank, loader in enumerate(loaders):
        samples = loader.step_samples(16, rank)
        firsts = [loader.first_sample(micro) for micro in range(2)]
        batches = [loader.next_batch(micro)[0] for micro in range(2)]
        windows = [row[0].item() // 8 for batch in batches for row in batch]
        assert [loader.window(i) for i in samples] == windows
        assert firsts[0] == samples[0]
    assert sorted(loaders[0].step_samples(16, 0) + loaders[1].step_samples(16, 1)) == list(
        range(16, 24))


# -- a job on a mixture of prepared datasets, end to end ---------------------------------------

def prepared(folder, word: str, documents: int = 40) -> str:
    from engine.data.prepare import prepare
    from engine.data.sources import SourceSpec

    raw = folder.parent / f"{folder.name}-raw"
    raw.mkdir(parents=True)
    for i in range(documents):
        (raw / f"doc-{i:03d}.txt").write_text(" ".join(f"{word}{(i * j) % 13}" for j in range(40)))
    prepare([SourceSpec("text", [str(raw / "*.txt")])], "bytes", str(folder), holdout=0.1)
    return str(folder)


def test_a_two_rank_job_on_a_mixture_reports_each_sources_tokens_and_losses(tmp_path):
    from engine.runtime.events import read_events
    from engine.runtime.launch import RunTarget, launch

    spec = parse_spec({
        "name": "mix", "model": {"preset": "nano"},
        "parallel": {"nodes": 1, "procs_per_node": 2},
        "train": {"steps": 6, "micro_batch": 2, "seq_len": 32, "eval_every": 3, "threads": 1,
                  "warmup": 2, "data": {"document_mask": True, "mix": [
                      {"path": prepared(tmp_path / "prose", "word"), "weight": 3,
                       "name": "prose"},
                      {"path": prepared(tmp_path / "code", "x_"), "weight": 1,
                       "name": "code"}]}},
        "checkpoint": {"every": 0}})
    target = RunTarget(run_dir=tmp_path / "mix", events_path=tmp_path / "mix.jsonl", job="mix")
    assert launch(spec, target) == 0
    steps = [e for e in read_events(target.events_path) if e["type"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 7))
    last = steps[-1]
    assert last["source_tokens"] == {"prose": 18 * 32, "code": 6 * 32}  # 24 samples at 3:1
    assert sum(last["source_tokens"].values()) == last["tokens"]
    assert all(set(e["source_loss"]) == {"prose", "code"} for e in steps)
    evaluated = [e for e in steps if e.get("eval_source_loss")]
    assert [e["step"] for e in evaluated] == [3, 6]
    for e in evaluated:
        losses = e["eval_source_loss"]
        assert e["eval_loss"] == pytest.approx(0.75 * losses["prose"] + 0.25 * losses["code"])
