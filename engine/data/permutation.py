"""A seeded permutation of `range(n)` computed one index at a time.

The loader visits each epoch's windows in a shuffled order. A table of the order (a
`randperm`) costs time and memory in proportion to the corpus at every start: 7.7M windows of a
2 GB corpus took 2 s and 60 MB per rank. A keyed bijection costs neither: a balanced Feistel
network over the smallest even power-of-two domain that holds `n` is a permutation of that
domain, and walking the cycle until the value falls below `n` ("cycle walking") restricts it
to a permutation of `range(n)`; the domain is less than four times `n`, so a lookup takes a
few rounds on average.
"""

from __future__ import annotations

ROUNDS = 4
_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: every input bit flips about half the output bits."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _M64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _M64
    return x ^ (x >> 31)


class Permutation:
    """`Permutation(n, seed)(i)`: where the seeded order of `range(n)` puts index `i`."""

    def __init__(self, n: int, seed: int):
        if n < 1:
            raise ValueError(f"a permutation needs at least one element, not {n}")
        self.n = n
        half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
        self.half_bits, self.half_mask = half_bits, (1 << half_bits) - 1
        self.keys = [_mix((seed & _M64) * ROUNDS + r + 1) for r in range(ROUNDS)]

    def _encrypt(self, x: int) -> int:
        left, right = x >> self.half_bits, x & self.half_mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & self.half_mask)
        return (left << self.half_bits) | right

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} outside a permutation of {self.n}")
        x = self._encrypt(i)
        while x >= self.n:  # ends: the cycle through i returns to range(n) at i at the latest
            x = self._encrypt(x)
        return x
