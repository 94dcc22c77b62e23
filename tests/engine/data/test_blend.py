"""The blend: Megatron's rule in closed form, exact proportions, live weight changes."""

from fractions import Fraction

import pytest
import torch

from engine.data.blend import Blend, parts_of


def megatron_reference(weights: list[float], samples: int) -> list[int]:
    """Megatron's loop as written: sample i to the source furthest below p_s * (i+1)."""
    p = [Fraction(w).limit_denominator() / sum(Fraction(x).limit_denominator() for x in weights)
         for w in weights]
    counts, order = [0] * len(p), []
    for i in range(samples):
        errors = [p[s] * (i + 1) - counts[s] for s in range(len(p))]
        s = errors.index(max(errors))
        counts[s] += 1
        order.append(s)
    return order


@pytest.mark.parametrize("weights", [[0.5, 0.3, 0.2], [0.7, 0.1, 0.1, 0.1], [1.0], [0.25, 0.75]])
def test_the_blend_is_megatrons_rule_and_its_counts_are_a_closed_form(weights):
    blend = Blend(weights)
    sources, samples = blend.assign(0, 3000)
    assert sources.tolist() == megatron_reference(weights, 3000)
    running = [0] * len(weights)
    for i, (s, k) in enumerate(zip(sources.tolist(), samples.tolist(), strict=True)):
        assert k == running[s]  # the sample of its source it is: the source's count so far
        running[s] += 1
        if i % 97 == 0:
            assert blend.counts_at(i + 1) == running


def test_proportions_are_exact_over_a_long_run_and_never_stray_by_a_sample():
    weights = [0.55, 0.3, 0.15]
    blend = Blend(weights)
    sources, _ = blend.assign(0, 1_000_000)
    assert torch.bincount(sources).tolist() == [550_000, 300_000, 150_000]
    counts = torch.nn.functional.one_hot(sources[:20_000]).cumsum(0)
    targets = torch.arange(1, 20_001)[:, None] * torch.tensor(weights)
    assert (counts - targets).abs().max() < 1
    assert blend.counts_at(123_456_789) == [round(123_456_789 * w) for w in weights]


def test_a_range_anywhere_is_what_the_run_from_the_start_gives():
    blend = Blend([0.6, 0.4])
    whole_sources, whole_samples = blend.assign(0, 5000)
    part_sources, part_samples = Blend([0.6, 0.4]).assign(3217, 3301)
    assert part_sources.tolist() == whole_sources[3217:3301].tolist()
    assert part_samples.tolist() == whole_samples[3217:3301].tolist()


def test_a_weight_change_takes_effect_at_its_index_and_travels_in_the_state():
    blend = Blend([0.5, 0.5])
    blend.set_weights([0.9, 0.1], at=1000)
    sources, samples = blend.assign(0, 11_000)
    assert torch.bincount(sources[:1000]).tolist() == [500, 500]
    assert torch.bincount(sources[1000:]).tolist() == [9000, 1000]
    # the samples of each source go on from where they were: none repeated, none skipped
    for s in (0, 1):
        assert samples[sources == s].tolist() == list(range(int((sources == s).sum())))
    restored = Blend([0.5, 0.5])
    restored.load_state_dict(blend.state_dict())
    assert [s.tolist() for s in restored.assign(900, 1100)] == \
        [s[900:1100].tolist() for s in (sources, samples)]


def test_a_change_at_an_earlier_index_replaces_the_later_ones():
    blend = Blend([0.5, 0.5])
    blend.set_weights([0.9, 0.1], at=1000)
    blend.set_weights([0.2, 0.8], at=600)  # after a rollback to before the first change
    assert [s.start for s in blend.segments] == [0, 600]
    blend.set_weights([0.2, 0.8], at=800)  # the weights in force: nothing new
    assert len(blend.segments) == 2


def test_weights_are_checked():
    with pytest.raises(ValueError, match="positive"):
        parts_of([0.5, 0.0])
    with pytest.raises(ValueError, match="2 sources, got 3"):
        Blend([1, 1]).set_weights([1, 1, 1], at=10)
    assert parts_of([2, 2, 2]) == (1, 1, 1)  # the shortest period
