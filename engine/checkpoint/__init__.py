"""Sharded, asynchronous, atomic checkpoints with resharding on load.

Saving (every rank, same steps):

    ckpt = Checkpointer.from_spec(spec.checkpoint, spec.name, rank=rank, world_size=world,
                                  meta={"strategy": ..., "nodes": ..., "procs_per_node": ...})
    if (tier := ckpt.due(step)):
        ckpt.save(step, sdp.sharded_state(), extras, to_disk=tier == "disk")
    ...
    ckpt.close()          # flushes; wait() flushes without stopping

Loading into any layout and world size (every rank, collectively):

    restored = restore([ckpt.memory_dir, ckpt.directory], lambda r: sdp.load_sharded_state(r.read))
    for bad in restored.skipped: emit anomaly(bad.path, bad.problem)
    extras = restored.extras(rank)      # or rank 0's for replicated facts

Layout, listing, pinning and retention: see `layout`.
"""

from engine.checkpoint.layout import (
    CheckpointError,
    CheckpointInfo,
    CorruptCheckpoint,
    find_latest_good,
    inspect,
    list_checkpoints,
    pin,
    remove,
    unpin,
)
from engine.checkpoint.reader import (
    CheckpointReader,
    Restored,
    Wants,
    load,
    load_into,
    open_checkpoint,
    read_extras,
    restore,
)
from engine.checkpoint.writer import Checkpointer, ShardedState, default_memory_dir

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointReader",
    "Checkpointer",
    "CorruptCheckpoint",
    "Restored",
    "ShardedState",
    "Wants",
    "default_memory_dir",
    "find_latest_good",
    "inspect",
    "list_checkpoints",
    "load",
    "load_into",
    "open_checkpoint",
    "pin",
    "read_extras",
    "remove",
    "restore",
    "unpin",
]
