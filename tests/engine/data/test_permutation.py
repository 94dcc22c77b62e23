"""The loader's seeded permutation: a bijection of range(n), computed per index."""

import pytest

from engine.data.permutation import Permutation


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 1000, 4097, 65536, 100_003])
def test_every_index_is_visited_exactly_once(n):
    order = Permutation(n, seed=7)
    assert sorted(order(i) for i in range(n)) == list(range(n))


def test_the_order_depends_on_the_seed_only():
    first, again, other = Permutation(1000, 1), Permutation(1000, 1), Permutation(1000, 2)
    assert [first(i) for i in range(1000)] == [again(i) for i in range(1000)]
    assert [first(i) for i in range(1000)] != [other(i) for i in range(1000)]
    assert [first(i) for i in range(1000)] != list(range(1000))  # shuffled


def test_an_index_outside_the_range_is_refused():
    with pytest.raises(IndexError):
        Permutation(10, 0)(10)
    with pytest.raises(ValueError):
        Permutation(0, 0)
