"""Sharded, asynchronous, atomic checkpoints with resharding on load.

Saving (every rank, same steps):

    ckpt = Checkpointer.from_spec(spec.checkpoint, spec.name, rank=rank, world_size=world,
                                  meta={"strategy": ..., "nodes": ..., "procs_per_node": ...})
    if (tier := ckpt.due(step)):
        ckpt.save(step, sdp.sharded_state(), extras, to_disk=tier == "disk")
    ...
    ckpt.close()          # flushes; wait() flushes without stopping

Loading into any layout and world size (every rank, collectively):

    restored = restore([ckpt.memory_dir, ckpt.directory], new_sdp.sharded_state())
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
from engine.checkpoint.reader import Restored, Wants, load, load_into, read_extras, restore
from engine.checkpoint.writer import Checkpointer, ShardedState, default_memory_dir

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
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
    "pin",
    "read_extras",
    "remove",
    "restore",
    "unpin",
]
