"""Sharded, asynchronous, atomic checkpoints with resharding on load.

Saving (every rank makes the same save calls; the constructor is collective when world > 1):

    ckpt = Checkpointer(directory, rank=rank, world_size=world, keep=c.keep, every=c.every,
                        memory_every=c.memory_every, memory_dir="auto" or None,
                        meta={"strategy": ..., "nodes": ..., "procs_per_node": ...})
    if (tier := ckpt.due(step)):
        blocked_s = ckpt.save(step, dp.sharded_state(), extras, to_disk=tier == CheckpointTier.DISK)
    ckpt.wait()           # flush (then a barrier, if every rank needs the checkpoint to exist)
    ckpt.forget_after(step)                 # after an in-process rollback to `step`
    ckpt.close(drop_memory_tier=True)       # a completed job; close() alone keeps the tier

Loading into any layout and world size (every rank, collectively):

    restored = restore([ckpt.memory_dir, ckpt.directory],
                       lambda reader: dp.load_sharded_state(reader.read))
    for bad in restored.skipped: publish an anomaly (bad.path, bad.problem)
    extras = restored.extras(0)   # any saved rank's extras: restored.extras(r)

Layout, listing, pinning and retention: see `layout`.
"""

from engine.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    # torch-free: the platform's supervisor finds checkpoints without loading torch
    "layout": ("CheckpointError", "CheckpointInfo", "CorruptCheckpoint", "find_latest_good",
               "inspect", "list_checkpoints", "pin", "present", "remove", "unpin"),
    "reader": ("CheckpointReader", "Restored", "Wants", "load", "load_into", "open_checkpoint",
               "read_extras", "restore"),
    "writer": ("Checkpointer", "ShardedState"),
})
