"""PaRO strategy names: one level each for parameters, gradients and optimizer states.

N = replicated, I = sharded within the node group (1/g), G = sharded globally (1/N).
See ../shared/specs/paro-horing.md sections 2-3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.contract import STRATEGIES

Level = Literal["N", "I", "G"]

# The ten effective strategies (engine.contract.STRATEGIES); the other 17 of the 27
# combinations are rejected. The old name stays for its callers outside the engine.


@dataclass(frozen=True)
class Strategy:
    params: Level
    grads: Level
    optim: Level

    @property
    def name(self) -> str:
        return self.params + self.grads + self.optim

    def fraction(self, level: Level, group_size: int, world_size: int) -> float:
        """The share of a full buffer a rank holds at `level`."""
        return {"N": 1.0, "I": 1.0 / group_size, "G": 1.0 / world_size}[level]


def parse_strategy(name: str) -> Strategy:
    """`Strategy` for a PaRO name such as "IIG"; a ValueError lists the valid names otherwise."""
    if not isinstance(name, str) or name.upper() not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}; got {name!r}")
    p, g, os = name.upper()
    return Strategy(p, g, os)  # type: ignore[arg-type]
