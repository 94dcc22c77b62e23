"""Data: the default corpus, user corpora, and a loader that resumes exactly."""

import re

import pytest
import torch

from engine.data.catalog import open_sources
from engine.runtime.data import DataError, TokenLoader, training_data
from engine.runtime.spec import parse_spec
from tests.engine.data.test_tokenizers import wide_tokenizer


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
    with pytest.raises(DataError, match=r"model\.vocab_size: 256 is smaller than the "
                                        r"tokenizer's vocabulary \(70000\)"):
        training_data(spec, rank=0, world_size=1)


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
