"""HO-Ring: collectives for a two-tier network (fast inside a node, one NIC per rail between).

Set-up, on every rank after `torch.distributed.init_process_group`::

    topo = Topology(nodes, procs_per_node).init_groups()   # or Topology.from_parallel(...)

Rank r is (node r // P, local r % P). `init_groups()` is collective; it checks that all ranks
agree on the shape and builds the intra-node groups, the inter-node rails (same local index on
every node) and a second communicator of each for the pipelined all-gather stages.

Collectives (stable interface; `algo` is "native" | "ring" | "hier" | "horing", `op` is
"sum" | "avg"; any dtype torch.distributed supports, "avg" only on floating point)::

    all_reduce(tensor, topo, algo="horing", op="sum", async_op=False,
               chunk_bytes=DEFAULT_CHUNK_BYTES) -> Handle | None
        in place; any shape (contiguous) and any length.

    reduce_scatter(output, input, topo, algo="horing", op="sum", async_op=False,
                   layout="rank", chunk_bytes=...) -> Handle | None
        input: flat buffer of any length n (left unchanged); output: shard_size(n, W) elements,
        receives this rank's shard shard_range(n, topo, rank, layout), zero past the end of n.

    all_gather(output, input, topo, algo="horing", async_op=False,
               layout="rank", chunk_bytes=...) -> Handle | None
        input: this rank's shard (shard_size(n, W) elements); output: the flat buffer of n.

    shard_size(numel, world_size) -> int            ceil(numel / world_size)
    shard_block(topo, rank, layout="rank") -> int   index of the block `rank` owns
    shard_range(numel, topo, rank, layout="rank") -> (start, stop)   clipped to numel

Layouts: "rank" gives block r to rank r (torch's reduce_scatter_tensor order); "nested" is
PaRO's (../shared/specs/paro-horing.md section 6): rank (k, j) owns block j*R + k, so its
node-level shard j*R .. j*R+R-1 contains its global block (engine.paro.layout.ShardLayout).

With async_op=True the call returns a Handle; `handle.wait()` blocks until done and re-raises
any error. Calls on one topology execute one at a time in issue order (like a CUDA stream),
on a worker thread per topology; the tensors must not be touched until wait() returns.
Collectives restricted to one node or one rail are plain torch.distributed calls on
`topo.intra` / `topo.inter`.

Cost model: `engine.horing.cost.predict(algo, op, nbytes, topo, links)` and
`engine.horing.cost.calibrate(topo)`.
"""

from engine.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "collectives": ("ALGOS", "DEFAULT_CHUNK_BYTES", "LAYOUTS", "OPS", "Handle", "all_gather",
                    "all_reduce", "reduce_scatter", "shard_block", "shard_range", "shard_size"),
    "topology": ("Topology",),
})
