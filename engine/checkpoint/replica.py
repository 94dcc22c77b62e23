"""Peer-replicated memory checkpoints: on several hosts, each rank's memory-tier snapshot is
also held in the RAM of the next host of a ring, so a lost host's shards survive it.

Saving (`ReplicaRing`, one per rank, created on every rank: the constructor is collective):
rank r sends each of its memory-tier parts to the same local rank of the next host,
`(r + ranks_per_host) % world_size`, over a TCP side channel of its own, from the persist
thread that just wrote the part (`Checkpointer.on_memory_part`) and so never beside the
training collectives. The receiver writes the part into its own host's memory tier under the
sender's file names (they carry the save id and the rank) and commits the checkpoint if the
part completed it: on two hosts every host then holds whole memory checkpoints. Each
connection proves it belongs to the job with a token the ranks agreed on; the receiver takes
only the files its one source rank may send, named as the writer names them.

Restoring (`gather`, collective, in the next incarnation, possibly on fewer hosts): the ranks
pool what their hosts' memory tiers hold, pick the newest memory checkpoint newer than the
newest disk one whose parts the survivors hold between them, copy every part a host lacks to
it (point to point over the process group: nothing else runs yet), and commit it on every
host, which then loads it resharded like any checkpoint.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import secrets
import socket
import struct
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.checkpoint import store
from engine.checkpoint.layout import (
    data_file_name,
    list_checkpoints,
    part_file_name,
    remove,
    step_dir_name,
)
from engine.checkpoint.writer import _commit_if_complete

# in a memory tier: its snapshots were replicated between hosts, so a relaunch of the job on
# the survivors looks for its newest memory checkpoint there (engine.runtime.launch)
MARKER = "REPLICATED"
_SAVE_ID = re.compile(r"^[A-Za-z0-9_]{1,64}-\d{6}$")
_PART = re.compile(r"^(?P<save_id>.+)\.rank-(?P<rank>\d{5})\.json$")
_HEADER = struct.Struct("!I")
_MOST_HEADER = 64 << 10
_MOST_PART = 64 << 20
_CHUNK = 4 << 20
_CONNECT_S = 10.0  # a peer that does not answer in this long is taken for gone
_TRANSFER_S = 600.0


class ReplicaRing:
    """This rank's place in the ring: sends its memory parts to `partner`, keeps `source`'s.

    memory_dir: this host's memory tier; keep: how many newest step folders it keeps (the
    memory tier's retention, which also bounds the replicas held: `bytes_held`).
    """

    def __init__(self, memory_dir: Path, rank: int, world_size: int, ranks_per_host: int,
                 keep: int) -> None:
        if world_size % ranks_per_host or world_size == ranks_per_host:
            raise ValueError(f"a ring needs several hosts of {ranks_per_host} ranks, got a "
                             f"world of {world_size}")
        self.memory_dir, self.rank, self.world_size, self.keep = memory_dir, rank, world_size, keep
        self.ranks_per_host = ranks_per_host
        self.partner = (rank + ranks_per_host) % world_size
        self.source = (rank - ranks_per_host) % world_size
        self.sent = self.received = self.failures = 0
        memory_dir.mkdir(parents=True, exist_ok=True)
        (memory_dir / MARKER).touch()
        self._server = socket.create_server((_address_peers_reach(), 0))
        token = [secrets.token_hex(16)]
        dist.broadcast_object_list(token, src=0)
        self._token = token[0]
        addresses: list[Any] = [None] * world_size
        dist.all_gather_object(addresses, self._server.getsockname()[:2])
        self._to = tuple(addresses[self.partner])
        self._thread = threading.Thread(target=self._serve, name=f"replica-r{rank}",
                                        daemon=True)
        self._thread.start()

    def send(self, step: int, save_id: str) -> None:
        """Send this rank's part of a memory save to the partner; on the persist thread. A peer
        that is gone costs this snapshot its replica, not the run (it is counted)."""
        step_dir = self.memory_dir / step_dir_name(step)
        files = [step_dir / data_file_name(save_id, self.rank),
                 step_dir / part_file_name(save_id, self.rank)]
        try:
            header = json.dumps({"token": self._token, "step": step, "save_id": save_id,
                                 "rank": self.rank, "world_size": self.world_size,
                                 "sizes": [f.stat().st_size for f in files]}).encode()
            with socket.create_connection(self._to, timeout=_CONNECT_S) as peer:
                peer.settimeout(_TRANSFER_S)
                peer.sendall(_HEADER.pack(len(header)) + header)
                for file in files:
                    with open(file, "rb") as f:
                        peer.sendfile(f)
                if peer.recv(1) != b"\x01":
                    raise ConnectionError("the peer did not keep the replica")
            self.sent += 1
        except OSError as e:
            self.failures += 1
            print(f"replica of step {step} to rank {self.partner} failed: {e!r}",
                  file=sys.stderr)
        prune(self.memory_dir, self.keep, 2 * self.ranks_per_host)

    def bytes_held(self) -> int:
        """Bytes of `source`'s replicas in this host's memory tier (this rank's memory cost)."""
        return sum(f.stat().st_size for info in list_checkpoints(self.memory_dir)
                   for f in Path(info.path).glob(f"*.rank-{self.source:05d}.*")
                   if not f.name.startswith("."))

    def close(self) -> None:
        try:
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept loop (close alone not)
        except OSError:
            pass
        self._server.close()
        self._thread.join(timeout=_CONNECT_S)

    def _serve(self) -> None:
        while True:
            try:
                peer, _ = self._server.accept()
            except OSError:  # closed
                return
            with peer:
                peer.settimeout(_TRANSFER_S)
                try:
                    self._receive(peer)
                    peer.sendall(b"\x01")
                except (OSError, ValueError) as e:
                    print(f"replica refused or lost: {e!r}", file=sys.stderr)

    def _receive(self, peer: socket.socket) -> None:
        """Keep one replicated part: checked, written whole, committed if it completes."""
        (length,) = _HEADER.unpack(_read_exactly(peer, _HEADER.size))
        if length > _MOST_HEADER:
            raise ValueError(f"a header of {length} bytes")
        header = json.loads(_read_exactly(peer, length))
        step, save_id, rank, sizes = self._checked(header)
        step_dir = self.memory_dir / step_dir_name(step)
        step_dir.mkdir(parents=True, exist_ok=True)
        names = (data_file_name(save_id, rank), part_file_name(save_id, rank))
        for name, size in zip(names, sizes, strict=True):  # the data file first, then its part
            store.write(step_dir / name, _chunks(peer, size), f"{save_id}.replica")
        store.sync_folder(step_dir)
        _commit_if_complete(step_dir, save_id, self.world_size, self.rank)
        self.received += 1
        prune(self.memory_dir, self.keep, 2 * self.ranks_per_host)

    def _checked(self, header: Any) -> tuple[int, str, int, list[int]]:
        """(step, save id, rank, file sizes) of a header that may come from anyone."""
        if not isinstance(header, dict) or not hmac.compare_digest(
                str(header.get("token", "")), self._token):
            raise ValueError("a sender without the job's token")
        step, save_id, rank = header.get("step"), header.get("save_id"), header.get("rank")
        sizes = header.get("sizes")
        if not (_is_int(step) and step >= 0 and isinstance(save_id, str)
                and _SAVE_ID.match(save_id) and rank == self.source and _is_int(rank)
                and header.get("world_size") == self.world_size and isinstance(sizes, list)
                and len(sizes) == 2 and all(_is_int(s) and s >= 0 for s in sizes)
                and sizes[1] <= _MOST_PART):
            raise ValueError(f"a malformed replica header from rank {rank!r}")
        return step, save_id, rank, sizes


def prune(memory_dir: Path, keep: int, parts: int) -> None:
    """A memory tier's retention on more than two hosts, where no host holds every part, so
    none commits: keep the `keep` newest settled step folders (committed, or holding `parts`
    parts: its own host's and its predecessor's) and pinned ones; a folder still receiving
    parts goes only once it is older than every kept one."""
    infos = list_checkpoints(memory_dir)
    settled = [i for i in infos if i.good or _parts_in(Path(i.path)) >= parts]
    kept = settled[-keep:] if keep > 0 else []
    oldest_kept = kept[0].step if kept else -1
    for info in infos:
        if info in kept or info.pinned or (info not in settled and info.step > oldest_kept):
            continue
        remove(info.path)


def _parts_in(step_dir: Path) -> int:
    return len({found["rank"] for name in store.sizes(step_dir)
                if (found := _PART.match(name)) is not None})


def replicated(memory_dir: Path) -> bool:
    """Whether a memory tier's snapshots were replicated between hosts."""
    return (memory_dir / MARKER).exists()


def gather(memory_dir: Path, rank: int, world_size: int, ranks_per_host: int,
           newer_than: int) -> Path | None:
    """Collective: the newest memory checkpoint newer than step `newer_than` that the hosts'
    memory tiers hold between them, made whole and committed in every host's memory tier; its
    folder here, or None where there is none."""
    leader = rank % ranks_per_host == 0  # one rank of each host reads and writes its tier
    mine = (newer_than, _holdings(memory_dir) if leader else {})
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, mine)
    chosen = _newest_whole([held for _, held in everyone], max(n for n, _ in everyone))
    if chosen is None:
        return None
    (step, save_id), parts = chosen
    step_dir = memory_dir / step_dir_name(step)
    for saved, holder, receiver in _transfers(everyone, (step, save_id), ranks_per_host):
        part = json.loads(parts[saved])
        if rank == holder:
            data = (step_dir / part["file"]).read_bytes()
            dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst=receiver)
        elif rank == receiver:
            data = torch.empty(part["nbytes"], dtype=torch.uint8)
            dist.recv(data, src=holder)
            step_dir.mkdir(parents=True, exist_ok=True)
            store.write(step_dir / part["file"], [memoryview(data.numpy())], f"{save_id}.gather")
            store.write(step_dir / part_file_name(save_id, saved), [parts[saved].encode()],
                        f"{save_id}.gather")
    if leader:
        _commit_if_complete(step_dir, save_id, int(json.loads(parts[0])["world_size"]), rank)
    dist.barrier()
    return step_dir


Holdings = dict[tuple[int, str], dict[int, str]]  # (step, save id) -> saved rank -> part JSON


def _holdings(memory_dir: Path) -> Holdings:
    """Every part in a memory tier whose data file is there whole."""
    held: Holdings = {}
    for info in list_checkpoints(memory_dir):
        files = store.sizes(info.path)
        for name in files:
            found = _PART.match(name)
            if found is None:
                continue
            text = (Path(info.path) / name).read_text()
            part = json.loads(text)
            rank = int(found["rank"])
            if (part["file"] == data_file_name(found["save_id"], rank)
                    and files.get(part["file"]) == part["nbytes"]):
                held.setdefault((part["step"], found["save_id"]), {})[rank] = text
    return held


def _newest_whole(holdings: list[Holdings], newer_than: int
                  ) -> tuple[tuple[int, str], dict[int, str]] | None:
    pooled: Holdings = {}
    for held in holdings:
        for key, parts in held.items():
            pooled.setdefault(key, {}).update(parts)
    whole = [(key, parts) for key, parts in pooled.items() if key[0] > newer_than
             and set(parts) == set(range(json.loads(next(iter(parts.values())))["world_size"]))]
    if not whole:
        return None
    # a step saved again by a later incarnation (after a restart) is taken as last saved
    return max(whole, key=lambda c: (c[0][0], json.loads(c[1][0])["time"]))


def _transfers(everyone: list[Any], key: tuple[int, str], ranks_per_host: int
               ) -> Iterator[tuple[int, int, int]]:
    """(saved rank, holding rank, receiving rank) for every part a host lacks, in one order
    all ranks follow (so every send meets its receive); each host's leader receives."""
    leaders = range(0, len(everyone), ranks_per_host)
    held = {leader: everyone[leader][1].get(key, {}) for leader in leaders}
    saved_ranks = sorted({r for parts in held.values() for r in parts})
    for receiver in leaders:
        for saved in saved_ranks:
            if saved not in held[receiver]:
                yield saved, next(h for h in leaders if saved in held[h]), receiver


def _address_peers_reach() -> str:
    """This host's address on the route to the rendezvous host, which the other hosts reach
    it at too (in a network namespace: its own NIC's, not what the host name resolves to)."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
        return probe.getsockname()[0]


def _read_exactly(peer: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = peer.recv(min(_CHUNK, n - len(data)))
        if not chunk:
            raise ConnectionError(f"the sender went after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def _chunks(peer: socket.socket, n: int) -> Iterator[bytes]:
    left = n
    while left:
        chunk = _read_exactly(peer, min(_CHUNK, left))
        left -= len(chunk)
        yield chunk


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
