"""engine.checkpoint.replica: every rank's memory snapshot is also held by the next host of a
ring, and the survivors of a lost host make its newest memory checkpoint whole again.

Real gloo ranks on this machine, each "host" a memory-tier folder of its own (hosts emulated
on one machine share /dev/shm; the engine keys the tier by RINGSIDE_HOST_NAME)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from engine.checkpoint import Checkpointer, CheckpointReader, inspect, list_checkpoints
from engine.checkpoint.replica import ReplicaRing, gather, replicated
from tests.engine.ranks import run_ranks

PER_RANK = 8  # elements of the one tensor each saving rank holds


def weights(step: int, world: int) -> torch.Tensor:
    return torch.arange(PER_RANK * world, dtype=torch.float32) * step


def save_in_a_ring(folder: str, ranks_per_host: int) -> dict:
    """Three memory snapshots of one tensor sharded over the ranks, each replicated; then
    the two attacks on the side channel (no token; a hostile file name)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    memory = Path(folder, f"host{rank // ranks_per_host}")
    ckpt = Checkpointer(Path(folder, "disk"), rank=rank, world_size=world, memory_dir=memory,
                        memory_keep=2)
    ring = ReplicaRing(memory, rank, world, ranks_per_host, keep=2)
    ckpt.on_memory_part = ring.send
    for step in (1, 2, 3):
        shard = weights(step, world)[rank * PER_RANK : (rank + 1) * PER_RANK]
        ckpt.save(step, {"w": (shard, rank * PER_RANK, PER_RANK * world)}, to_disk=False)
    ckpt.wait()
    dist.barrier()
    refused = [_forged(ring, token) for token in ("not-the-token", ring._token)]
    dist.barrier()
    held = ring.bytes_held()
    ckpt.close()
    ring.close()
    return {"held": held, "sent": ring.sent, "failures": ring.failures, "refused": refused}


def _forged(ring: ReplicaRing, token: str) -> bytes:
    """What the partner answers a sender with `token` whose part would land outside its tier."""
    header = json.dumps({"token": token, "step": 9, "save_id": "../../escaped-000001",
                         "rank": ring.rank, "world_size": ring.world_size,
                         "sizes": [1, 1]}).encode()
    with socket.create_connection(ring._to, timeout=10) as peer:
        peer.sendall(len(header).to_bytes(4, "big") + header + b"xx")
        try:
            return peer.recv(1)
        except ConnectionResetError:  # closed with the forged bytes unread
            return b""


def gather_and_load(folder: str, hosts: list[str]) -> tuple[bool, list[float]]:
    """In a new world of one rank per surviving host: whether a disk checkpoint at the newest
    memory step wins over it; then the newest memory checkpoint made whole, and this rank's
    half of the tensor loaded from it (resharded)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    memory = Path(folder, hosts[rank])
    disk_wins = gather(memory, rank, world, 1, newer_than=3) is None
    whole = gather(memory, rank, world, 1, newer_than=-1)
    with CheckpointReader(inspect(whole)) as reader:
        half = reader.tensors["w"]["length"] // world
        return disk_wins, reader.read("w", rank * half, half).tolist()


def test_two_hosts_each_hold_every_memory_checkpoint_whole(tmp_path):
    results = run_ranks(save_in_a_ring, str(tmp_path), 2, nodes=2, procs_per_node=2,
                        timeout_s=60)
    for host in ("host0", "host1"):
        kept = list_checkpoints(tmp_path / host)
        assert [(c.step, c.good, c.world_size) for c in kept] == [(2, True, 4), (3, True, 4)]
        assert replicated(tmp_path / host)
        with CheckpointReader(kept[-1]) as reader:  # every rank's shard, from this host alone
            assert torch.equal(reader.read("w", 0, 4 * PER_RANK), weights(3, 4))
    part = kept[-1].size // 4  # one rank's data file; its part JSON on top
    for result in results:
        assert (result["sent"], result["failures"]) == (3, 0)
        assert 2 * part < result["held"] < 2 * part + 2 * 4096  # two kept steps of one rank
        # a sender without the token, or naming a file outside the tier, is refused
        assert result["refused"] == [b"", b""]
    assert not list(tmp_path.rglob("*escaped*"))


def test_the_survivors_of_a_lost_host_restore_its_shards_from_their_replicas(tmp_path):
    run_ranks(save_in_a_ring, str(tmp_path), 1, nodes=3, procs_per_node=1, timeout_s=60)
    # three hosts: none holds every part, so none committed; each holds its own and its
    # predecessor's parts of the two newest steps
    for host in ("host0", "host1", "host2"):
        assert [(c.step, c.good) for c in list_checkpoints(tmp_path / host)] == [
            (2, False), (3, False)]
    lost = tmp_path / "host2"
    for f in lost.rglob("*"):
        if f.is_file():
            f.unlink()

    (disk_wins, first), (_, second) = run_ranks(gather_and_load, str(tmp_path),
                                                ["host0", "host1"], nodes=2, procs_per_node=1,
                                                timeout_s=60)
    assert disk_wins  # a disk checkpoint as new as every memory one is taken instead
    assert first + second == weights(3, 3).tolist()
    for host in ("host0", "host1"):  # now whole and committed on both survivors
        newest = list_checkpoints(tmp_path / host)[-1]
        assert (newest.step, newest.good, newest.world_size) == (3, True, 3)
