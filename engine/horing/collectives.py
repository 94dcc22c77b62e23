"""All-reduce, reduce-scatter and all-gather as flat ring, hierarchical and HO-Ring.

Every algorithm is built from one primitive, a ring over a list of ranks whose positions each
end up owning a *piece* of a flat buffer (`_ring_reduce_scatter`, `_ring_all_gather`), sent
with torch.distributed point-to-point ops batched by `batch_isend_irecv`, so the same code
runs on gloo and NCCL.

A collective is described as W *blocks* (ranges of the flat buffer; block b ends on the rank
that owns it) and a list of *stages*, each a ring over one process group:

    all-reduce      intra RS -> inter RS -> inter AG -> intra AG
    reduce-scatter  intra RS -> inter RS
    all-gather                  inter AG -> intra AG

`hier` runs the stages one after another over the whole buffer. `horing` cuts the buffer
into chunks and runs every stage in its own thread on its own communicator, so while chunk i
is on the NIC (every rail's inter ring at once), chunk i+1 is in the intra reduce-scatter and
chunk i-1 in the intra all-gather. `ring` is one flat ring over all ranks.

Collectives on one topology run one at a time in issue order on a per-topology worker
thread, so async handles behave like a CUDA stream: later calls queue behind earlier ones.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.contract import COLLECTIVES as ALGOS
from engine.horing.chunks import (
    DEFAULT_CHUNK_BYTES,
    Piece,
    Range,
    chunk_count,
    pipeline_split,
    split,
)
from engine.horing.topology import Topology

OPS = ("sum", "avg")
LAYOUTS = ("rank", "nested")



class Handle:
    """Completion of an asynchronous collective; `wait()` blocks and re-raises its error."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def wait(self, timeout: float | None = None) -> None:
        self._future.result(timeout)

    def is_completed(self) -> bool:
        return self._future.done()


# ---------------------------------------------------------------------------- public API


def shard_size(numel: int, world_size: int) -> int:
    """Elements of one rank's shard of a `numel`-element buffer (the last ones are padded)."""
    return -(-numel // world_size)


def shard_block(topo: Topology, rank: int, layout: str = "rank") -> int:
    """Index of the block of a flat buffer that `rank` owns: `rank` itself in the `rank`
    layout, j*R + k for rank (node k, local j) in PaRO's `nested` layout."""
    _check_choice("layout", layout, LAYOUTS)
    if layout == "rank":
        return rank
    return topo.local_rank_of(rank) * topo.nodes + topo.node_of(rank)


def shard_range(numel: int, topo: Topology, rank: int, layout: str = "rank") -> Range:
    """The [start, stop) of `rank`'s shard in a `numel`-element buffer, clipped to numel."""
    size = shard_size(numel, topo.world_size)
    start = min(shard_block(topo, rank, layout) * size, numel)
    return start, min(start + size, numel)


def all_reduce(
    tensor: torch.Tensor,
    topo: Topology,
    algo: str = "horing",
    op: str = "sum",
    async_op: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Handle | None:
    """Reduce `tensor` (any shape, contiguous) in place over all ranks of `topo`."""
    _check_call(topo, algo, op, chunk_bytes, tensor=tensor)
    return _submit(
        topo, async_op, lambda: _all_reduce(tensor.view(-1), topo, algo, op, chunk_bytes)
    )


def reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    topo: Topology,
    algo: str = "horing",
    op: str = "sum",
    async_op: bool = False,
    layout: str = "rank",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Handle | None:
    """Reduce the flat `input` (numel n, any n) over all ranks and write this rank's shard,
    `shard_range(n, topo, rank, layout)`, into `output` (numel `shard_size(n, W)`; the part
    past the end of the buffer is zero). `input` is left unchanged."""
    _check_call(topo, algo, op, chunk_bytes, tensor=input, output=output, layout=layout)
    expected = shard_size(input.numel(), topo.world_size)
    if output.numel() != expected:
        raise ValueError(
            f"output: reduce_scatter of {input.numel()} elements over {topo.world_size} ranks "
            f"needs a {expected}-element output, got {output.numel()}"
        )
    return _submit(
        topo,
        async_op,
        lambda: _reduce_scatter(
            output.view(-1), input.view(-1), topo, algo, op, layout, chunk_bytes
        ),
    )


def all_gather(
    output: torch.Tensor,
    input: torch.Tensor,
    topo: Topology,
    algo: str = "horing",
    async_op: bool = False,
    layout: str = "rank",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Handle | None:
    """Gather every rank's shard `input` (numel `shard_size(n, W)`) into the flat `output`
    (numel n, any n): rank r's shard lands at `shard_range(n, topo, r, layout)`."""
    _check_call(topo, algo, "sum", chunk_bytes, tensor=output, output=input, layout=layout)
    expected = shard_size(output.numel(), topo.world_size)
    if input.numel() != expected:
        raise ValueError(
            f"input: all_gather into {output.numel()} elements over {topo.world_size} ranks "
            f"needs a {expected}-element input shard, got {input.numel()}"
        )
    return _submit(
        topo,
        async_op,
        lambda: _all_gather(output.view(-1), input.view(-1), topo, algo, layout, chunk_bytes),
    )


# ------------------------------------------------------------------------- validation


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _check_call(
    topo: Topology,
    algo: str,
    op: str,
    chunk_bytes: int,
    tensor: torch.Tensor,
    output: torch.Tensor | None = None,
    layout: str = "rank",
) -> None:
    _check_choice("algo", algo, ALGOS)
    _check_choice("op", op, OPS)
    _check_choice("layout", layout, LAYOUTS)
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed must be initialised before a horing collective")
    if topo.global_group is None:
        raise RuntimeError("topo: call topo.init_groups() on every rank before a collective")
    if dist.get_world_size() != topo.world_size:
        raise ValueError(
            f"topo: topology {topo.nodes}x{topo.procs_per_node} has {topo.world_size} ranks, "
            f"but the process group has {dist.get_world_size()}"
        )
    for name, t in (("tensor", tensor), ("output", output)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if output is not None and (output.dtype != tensor.dtype or output.device != tensor.device):
        raise ValueError(
            f"output and input must share dtype and device, got {output.dtype}/{output.device} "
            f"and {tensor.dtype}/{tensor.device}"
        )
    if op == "avg" and not tensor.is_floating_point():
        raise ValueError(f"op='avg' needs a floating-point tensor, got {tensor.dtype}")


# ----------------------------------------------------------------------- ordering


class _Workspace:
    """Per topology: the worker thread that runs its collectives in issue order, and reusable
    buffers. Fresh CPU buffers of many MB cost a page fault per 4 KiB on first touch, as much
    as the transfer itself over loopback, so scratch space is kept and grown as needed."""

    def __init__(self) -> None:
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="horing")
        self.buffers: dict[tuple, torch.Tensor] = {}

    def buffer(self, name: str, like: torch.Tensor, numel: int) -> torch.Tensor:
        """A 1-D buffer of `numel` elements of `like`'s dtype and device; each name is used
        by one thread at a time (one stage of the collective in flight)."""
        key = (name, like.dtype, like.device)
        held = self.buffers.get(key)
        if held is None or held.numel() < numel:
            held = self.buffers[key] = like.new_empty(numel)
        return held[:numel]


_WORKSPACES: dict[int, _Workspace] = {}


def _workspace(topo: Topology) -> _Workspace:
    space = _WORKSPACES.get(id(topo))
    if space is None:
        space = _WORKSPACES[id(topo)] = _Workspace()
        weakref.finalize(topo, _retire, id(topo))
    return space


def _retire(key: int) -> None:
    _WORKSPACES.pop(key).worker.shutdown(wait=False)


def _submit(topo: Topology, async_op: bool, run: Callable[[], None]) -> Handle | None:
    handle = Handle(_workspace(topo).worker.submit(run))
    if async_op:
        return handle
    handle.wait()
    return None


# ------------------------------------------------------------------ ring primitives


def _merge(piece: Piece) -> Piece:
    """Join adjacent ranges and drop empty ones, so a piece goes out in as few messages
    as possible (and empty tensors never do)."""
    merged: Piece = []
    for start, stop in piece:
        if stop <= start:
            continue
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged


def _exchange(
    flat: torch.Tensor,
    send: Piece,
    recv: list[torch.Tensor],
    dst: int,
    src: int,
    group,
) -> None:
    ops = [dist.P2POp(dist.irecv, t, src, group) for t in recv]
    ops += [dist.P2POp(dist.isend, flat[a:b], dst, group) for a, b in send]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _ring_reduce_scatter(
    flat: torch.Tensor,
    pieces: list[Piece],
    ring: list[int],
    group,
    scratch: Callable[[int], torch.Tensor] | None = None,
    src: torch.Tensor | None = None,
) -> None:
    """Sum `pieces[p]` over the ring so that position p ends holding the total in place.
    `scratch(numel)` gives the receive buffer (a fresh one when not given). With `src` (same
    length as `flat`) the local contributions are read from `src` instead: every piece this
    position receives is written once as src + received, so `flat` needs no copy of `src`
    first (pieces this position never receives are left as they were)."""
    n = len(ring)
    if n == 1:
        return
    p = ring.index(dist.get_rank())
    pieces = [_merge(piece) for piece in pieces]
    largest = max(sum(b - a for a, b in piece) for piece in pieces)
    recv_space = scratch(largest) if scratch is not None else flat.new_empty(largest)
    for step in range(n - 1):
        # at step s position p passes on its partial sum of piece p-s-1 and adds into p-s-2,
        # so after n-1 steps piece p has visited every position and ends at p
        # (the piece sent at step 0 is untouched, so it goes out straight from src; each
        # later one was received, and so written into flat, at the step before)
        send, recv = pieces[(p - step - 1) % n], pieces[(p - step - 2) % n]
        bufs, offset = [], 0
        for a, b in recv:
            bufs.append(recv_space[offset : offset + b - a])
            offset += b - a
        origin = src if src is not None and step == 0 else flat
        _exchange(origin, send, bufs, ring[(p + 1) % n], ring[(p - 1) % n], group)
        for (a, b), buf in zip(recv, bufs, strict=True):
            if src is None:
                flat[a:b].add_(buf)
            else:
                torch.add(src[a:b], buf, out=flat[a:b])


def _ring_all_gather(flat: torch.Tensor, pieces: list[Piece], ring: list[int], group) -> None:
    """Position p holds `pieces[p]`; afterwards every position holds all pieces."""
    n = len(ring)
    if n == 1:
        return
    p = ring.index(dist.get_rank())
    pieces = [_merge(piece) for piece in pieces]
    for step in range(n - 1):
        send, recv = pieces[(p - step) % n], pieces[(p - step - 1) % n]
        bufs = [flat[a:b] for a, b in recv]
        _exchange(flat, send, bufs, ring[(p + 1) % n], ring[(p - 1) % n], group)


# ------------------------------------------------------------------------ stages


Stage = Callable[[list[Range], int], None]  # runs one phase on one chunk (its W blocks) on a lane


@dataclass(frozen=True)
class _Stage:
    run: Stage
    lanes: int  # chunks in flight at once, each lane on its own communicator


def _stages(
    flat: torch.Tensor,
    topo: Topology,
    block_of: list[int],
    kinds: tuple[str, ...],
    scale: float | None,
    space: _Workspace,
    src: torch.Tensor | None = None,
) -> list[_Stage]:
    """The phases of a hierarchical collective as functions of a chunk's blocks. `block_of[r]`
    is the block rank r owns; `scale` divides the owned block after the last reduction; the
    first reduction reads the local contributions from `src` when given (see
    `_ring_reduce_scatter`)."""
    trivial = {"intra_rs", "intra_ag"} if topo.procs_per_node == 1 else set()
    trivial |= {"inter_rs", "inter_ag"} if topo.nodes == 1 else set()
    kinds = tuple(kind for kind in kinds if kind not in trivial)
    # a lone inter stage (a reduce-scatter's or an all-gather's) runs two chunks at once, on
    # the rail's two communicators: while one lane waits on its partner or on its thread
    # being scheduled, the other keeps the NIC busy (an all-reduce's inter RS and inter AG
    # already overlap each other that way; giving each of them a second lane as well was
    # slower, measured: more threads competing for the host's cores)
    inter_lanes = 2 if sum(kind.startswith("inter") for kind in kinds) == 1 else 1
    phases = _Phases(flat, topo, block_of, kinds, scale, space, src)
    return [
        _Stage(
            phases.reduce(kind) if kind in phases.reductions else phases.gather(kind),
            inter_lanes if kind.startswith("inter") else 1,
        )
        for kind in kinds
    ]


class _Phases:
    """The ring phases of one hierarchical collective, seen from this rank."""

    def __init__(self, flat: torch.Tensor, topo: Topology, block_of: list[int],
                 kinds: tuple[str, ...], scale: float | None, space: _Workspace,
                 src: torch.Tensor | None):
        self.flat, self.topo, self.block_of = flat, topo, block_of
        self.scale, self.space, self.src = scale, space, src
        self.me = dist.get_rank()
        self.intra_ring = topo.node_ranks(topo.node_of(self.me))
        self.rail_ring = topo.rail_ranks(topo.local_rank_of(self.me))
        self.reductions = [kind for kind in kinds if kind.endswith("_rs")]
        self.rails = {"inter_rs": (topo.inter, topo.inter_ag),
                      "inter_ag": (topo.inter_ag, topo.inter)}

    def intra_pieces(self, blocks: list[Range]) -> list[Piece]:
        # position j of a node ring collects everything rail j will own
        return [[blocks[self.block_of[r]] for r in self.topo.rail_ranks(j)]
                for j in range(len(self.intra_ring))]

    def rail_pieces(self, blocks: list[Range]) -> list[Piece]:
        return [[blocks[self.block_of[r]]] for r in self.rail_ring]

    def scratch(self, name: str) -> Callable[[int], torch.Tensor]:
        return lambda numel: self.space.buffer(name, self.flat, numel)

    def finish(self, blocks: list[Range]) -> None:
        if self.scale is not None:
            a, b = blocks[self.block_of[self.me]]
            self.flat[a:b].div_(self.scale)

    def reduce(self, kind: str) -> Stage:
        def run(blocks: list[Range], lane: int) -> None:
            origin = self.src if kind == self.reductions[0] else None
            if kind == "intra_rs":
                pieces, ring, group = self.intra_pieces(blocks), self.intra_ring, self.topo.intra
            else:
                pieces, ring, group = (self.rail_pieces(blocks), self.rail_ring,
                                       self.rails[kind][lane])
            _ring_reduce_scatter(self.flat, pieces, ring, group, self.scratch(f"{kind}{lane}"),
                                 origin)
            if kind == self.reductions[-1]:
                self.finish(blocks)

        return run

    def gather(self, kind: str) -> Stage:
        def run(blocks: list[Range], lane: int) -> None:
            if kind == "intra_ag":
                _ring_all_gather(self.flat, self.intra_pieces(blocks), self.intra_ring,
                                 self.topo.intra_ag)
            else:
                _ring_all_gather(self.flat, self.rail_pieces(blocks), self.rail_ring,
                                 self.rails[kind][lane])

        return run


def _run(stages: list[_Stage], chunks: list[list[Range]], pipelined: bool) -> None:
    """Push every chunk through every stage: stage by stage, or as a pipeline with one thread
    per stage lane (each lane owns its communicator, so the threads never share one). Lane l
    of a stage takes the chunks i with i % lanes == l, in order, so every rank runs the same
    sequence of collectives on every communicator."""
    if not pipelined or len(chunks) < 2:
        for stage in stages:
            for chunk in chunks:
                stage.run(chunk, 0)
        return
    errors: list[BaseException] = []
    # inbox[s][u][l]: the chunks lane u of stage s-1 passes to lane l of stage s, in order
    # (stage 0 has one upstream lane: the chunks in order)
    upstream_lanes = [1] + [stage.lanes for stage in stages[:-1]]
    inbox = [
        [[queue.SimpleQueue() for _ in range(stage.lanes)] for _ in range(ups)]
        for ups, stage in zip(upstream_lanes, stages, strict=True)
    ]
    for i, chunk in enumerate(chunks):
        inbox[0][0][i % stages[0].lanes].put(chunk)

    def work(index: int, lane: int) -> None:
        stage = stages[index]
        upstream = inbox[index]
        try:
            for i in range(lane, len(chunks), stage.lanes):
                chunk = upstream[i % len(upstream)][lane].get()
                if chunk is None:  # an earlier stage failed
                    break
                stage.run(chunk, lane)
                if index + 1 < len(stages):
                    nxt = stages[index + 1].lanes
                    inbox[index + 1][lane][i % nxt].put(chunk)
        except BaseException as error:  # noqa: BLE001 - re-raised by the caller
            errors.append(error)
        finally:
            # wake every later lane that may be waiting on this one (a no-op after success:
            # they read only as many chunks as were sent)
            if errors and index + 1 < len(stages):
                for q in inbox[index + 1][lane]:
                    q.put(None)

    threads = [
        threading.Thread(target=work, args=(i, lane), daemon=True)
        for i, stage in enumerate(stages)
        for lane in range(stage.lanes)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]





# --------------------------------------------------------------------- collectives


_AR_STAGES = ("intra_rs", "inter_rs", "inter_ag", "intra_ag")
_RS_STAGES = ("intra_rs", "inter_rs")
_AG_STAGES = ("inter_ag", "intra_ag")


def _all_reduce(flat: torch.Tensor, topo: Topology, algo: str, op: str, chunk_bytes: int) -> None:
    world, space = topo.world_size, _workspace(topo)
    scale = world if op == "avg" else None
    if algo == "native":
        reduce_op = dist.ReduceOp.AVG if op == "avg" else dist.ReduceOp.SUM
        dist.all_reduce(flat, op=reduce_op, group=topo.global_group)
        return
    # for an all-reduce any block ownership will do; the nested one makes every intra
    # piece one contiguous range
    block_of = [shard_block(topo, r, "nested") for r in range(world)]
    count = chunk_count(
        algo, flat.numel() * flat.element_size(), flat.numel() // world, chunk_bytes
    )
    chunks = [split(a, b, world) for a, b in pipeline_split(0, flat.numel(), count)]
    if algo == "ring":
        _flat_ring(flat, topo, chunks[0], block_of, ("rs", "ag"), scale, space)
        return
    stages = _stages(flat, topo, block_of, _AR_STAGES, scale, space)
    _run(stages, chunks, pipelined=algo == "horing")


def _flat_ring(
    flat: torch.Tensor,
    topo: Topology,
    blocks: list[Range],
    block_of: list[int],
    phases: tuple[str, ...],
    scale: float | None,
    space: _Workspace,
    src: torch.Tensor | None = None,
) -> None:
    ring = list(range(topo.world_size))
    pieces = [[blocks[block_of[r]]] for r in ring]
    if "rs" in phases:
        scratch = lambda numel: space.buffer("ring", flat, numel)  # noqa: E731
        _ring_reduce_scatter(flat, pieces, ring, topo.global_group, scratch, src)
        if scale is not None:
            a, b = blocks[block_of[dist.get_rank()]]
            flat[a:b].div_(scale)
    if "ag" in phases:
        _ring_all_gather(flat, pieces, ring, topo.global_group)


def _block_chunks(shard: int, world: int, count: int) -> list[list[Range]]:
    """Chunk i of a buffer of `world` blocks of `shard` elements: sub-range i of every block."""
    subs = pipeline_split(0, shard, count)
    return [[(b * shard + a, b * shard + z) for b in range(world)] for a, z in subs]


def _reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    topo: Topology,
    algo: str,
    op: str,
    layout: str,
    chunk_bytes: int,
) -> None:
    world, shard, space = topo.world_size, output.numel(), _workspace(topo)
    block_of = [shard_block(topo, r, layout) for r in range(world)]
    me = dist.get_rank()
    # reduce in a zero-padded copy: the input stays intact and every block has `shard` elements
    work = space.buffer("rs_work", input, world * shard)
    if algo == "native":
        # torch hands block r to rank r, so lay the blocks out in rank order
        for r in range(world):
            a, b = shard_range(input.numel(), topo, r, layout)
            work[r * shard : r * shard + b - a].copy_(input[a:b])
            work[r * shard + b - a : (r + 1) * shard].zero_()
        reduce_op = dist.ReduceOp.AVG if op == "avg" else dist.ReduceOp.SUM
        dist.reduce_scatter_single(output, work, op=reduce_op, group=topo.global_group)
        return
    # an unpadded input is read in place by the first reduction (no copy of it up front, on
    # the critical path); a padded one, or a world of one, goes through a zero-padded copy
    src = input if input.numel() == work.numel() and world > 1 else None
    if src is None:
        work[: input.numel()].copy_(input)
        work[input.numel() :].zero_()
    scale = world if op == "avg" else None
    count = chunk_count(algo, work.numel() * work.element_size(), shard, chunk_bytes)
    chunks = _block_chunks(shard, world, count)
    if algo == "ring":
        _flat_ring(work, topo, chunks[0], block_of, ("rs",), scale, space, src)
    else:
        stages = _stages(work, topo, block_of, _RS_STAGES, scale, space, src)
        _run(stages, chunks, pipelined=algo == "horing")
    mine = block_of[me] * shard
    output.copy_(work[mine : mine + shard])


def _all_gather(
    output: torch.Tensor,
    input: torch.Tensor,
    topo: Topology,
    algo: str,
    layout: str,
    chunk_bytes: int,
) -> None:
    world, shard, numel, space = topo.world_size, input.numel(), output.numel(), _workspace(topo)
    block_of = [shard_block(topo, r, layout) for r in range(world)]
    me = dist.get_rank()
    padded = world * shard == numel and (algo != "native" or layout == "rank")
    work = output if padded else space.buffer("ag_work", output, world * shard)
    if algo == "native":
        dist.all_gather_single(work, input, group=topo.global_group)
        if work is not output:
            for r in range(world):
                a, b = shard_range(numel, topo, r, layout)
                output[a:b].copy_(work[r * shard : r * shard + b - a])
        return
    mine = block_of[me] * shard
    work[mine : mine + shard].copy_(input)
    count = chunk_count(algo, work.numel() * work.element_size(), shard, chunk_bytes)
    chunks = _block_chunks(shard, world, count)
    if algo == "ring":
        _flat_ring(work, topo, chunks[0], block_of, ("ag",), None, space)
    else:
        stages = _stages(work, topo, block_of, _AG_STAGES, None, space)
        _run(stages, chunks, pipelined=algo == "horing")
    if work is not output:
        output.copy_(work[:numel])
