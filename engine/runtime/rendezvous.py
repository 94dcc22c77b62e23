"""How a launcher meets the others of its job, apart from the launcher (`engine.runtime.launch`):
the command line reads it from its arguments without importing torch, so the ranks' forkserver
can start first (`engine.runtime.cli.start_ranks_server`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Rendezvous:
    """How this launcher meets the others of the job, as torchrun's `--nnodes MIN:MAX
    --rdzv-endpoint HOST:PORT --rdzv-id ID --local-addr ADDR` say: between `min_nodes` and
    `max_nodes` hosts meet at `endpoint`, whose host holds the c10d store. The default is a
    job on this host alone, at a free port of the loopback."""

    min_nodes: int = 1
    max_nodes: int = 1
    endpoint: str = ""  # HOST:PORT; "" = 127.0.0.1 and a free port for each launch
    run_id: str = ""  # "" = the job id
    local_addr: str | None = None  # the address the other hosts reach this one at
    configs: dict[str, str] = dataclasses.field(default_factory=dict)  # torchrun's --rdzv-conf
    # this host's place among the job's hosts, as whoever placed them numbered it (the
    # platform, Slurm, the command line): 0 is the lead, on the endpoint's host
    node_rank: int = 0

    @property
    def host(self) -> str:
        return self.endpoint.rpartition(":")[0].strip("[]") or "127.0.0.1"
