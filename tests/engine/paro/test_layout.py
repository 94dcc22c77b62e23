"""Strategy names and the nested shard layout (spec sections 2 and 6)."""

import pytest

from engine.contract import STRATEGIES
from engine.paro import ShardLayout, parse_strategy


def test_the_ten_strategies_parse_into_their_levels():
    assert len(STRATEGIES) == 10
    s = parse_strategy("IIG")
    assert (s.params, s.grads, s.optim, s.name) == ("I", "I", "G", "IIG")


@pytest.mark.parametrize("bad", ["GNN", "NNI", "XYZ", "", "iigg", None])
def test_anything_else_is_rejected_with_the_valid_names(bad):
    with pytest.raises(ValueError, match="NNN, NNG, NGG, GGG, NII, NIG, IIG, IGG, ING, III"):
        parse_strategy(bad)


def test_2x2_example_from_the_spec():
    """(k, j) = (0,0) owns block 0 and intra blocks 0-1; (1,0) block 1; (0,1) block 2; (1,1) 3."""
    lay = ShardLayout(numel=8, groups=2, group_size=2)
    owners = {(k, j): lay.start("G", k, j) // lay.block for k in range(2) for j in range(2)}
    assert owners == {(0, 0): 0, (1, 0): 1, (0, 1): 2, (1, 1): 3}
    assert [lay.start("I", k, 1) for k in range(2)] == [4, 4]
    assert lay.size("I") == 4 and lay.size("G") == 2 and lay.size("N") == 8


def test_every_global_block_sits_inside_its_intra_shard_and_blocks_tile_the_buffer():
    lay = ShardLayout(numel=1957, groups=2, group_size=4)
    assert lay.padded == 1960 and lay.block == 245
    seen = []
    for k in range(2):
        for j in range(4):
            g, i = lay.start("G", k, j), lay.start("I", k, j)
            assert i <= g and g + lay.size("G") <= i + lay.size("I")
            seen.append(lay.real_range("G", k, j))
    seen.sort()
    assert seen[0][0] == 0 and seen[-1][1] == 1957
    assert all(a[1] == b[0] for a, b in zip(seen, seen[1:], strict=False))
