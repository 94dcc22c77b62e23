"""PaRO sharded data parallelism over flat buffers (../shared/specs/paro-horing.md 4-6).

All parameters live in one flat buffer in `module.parameters()` order -- the same order for
every strategy and world size, so global offsets mean the same thing everywhere (checkpoints,
resharding). Three copies of that buffer exist, each partitioned at its own level:

- parameters (model dtype) at level p; when p is I or G the full buffer is gathered before
  forward and again before backward, and its storage is freed after each (the parameters are
  views into it, so autograd's saved references come back to life when it is re-filled);
- gradient accumulator (model dtype) at level g;
- fp32 master weights and the AdamW moments at level os.

Each micro-step reduces the local gradient to level g; the boundary reduces it to level os,
averages, clips on the global norm, steps AdamW on the owned shard and brings the parameters
back to level p. Which collectives that takes is exactly the spec's section 5 table.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.adamw import adamw

from engine.horing.topology import Topology
from engine.paro.comm import Comm
from engine.paro.layout import ShardLayout
from engine.paro.strategy import parse_strategy
from engine.xputimer import OpTimer

STATE_KINDS = ("params", "exp_avg", "exp_avg_sq")


def _check_arguments(params: list[nn.Parameter], lr: float, betas: tuple[float, float],
                     eps: float, weight_decay: float, grad_accum: int) -> None:
    if grad_accum < 1:
        raise ValueError(f"grad_accum must be at least 1, got {grad_accum}")
    if lr < 0 or weight_decay < 0 or eps <= 0 or not all(0 <= b < 1 for b in betas):
        raise ValueError(
            f"need lr >= 0, weight_decay >= 0, eps > 0 and betas in [0, 1); got lr={lr}, "
            f"weight_decay={weight_decay}, eps={eps}, betas={betas}"
        )
    if not params:
        raise ValueError("model: has no parameters to shard")
    if any(not p.requires_grad for p in params):
        raise ValueError("model: frozen parameters (requires_grad=False) are not supported")
    if len({p.dtype for p in params}) != 1 or len({p.device for p in params}) != 1:
        raise ValueError("model: all parameters must share one dtype and one device")


class ShardedDataParallel:
    def __init__(
        self,
        model: nn.Module,
        topo: Topology,
        strategy: str,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.1,
        grad_accum: int = 1,
        collective: str = "native",
        timer: OpTimer | None = None,
    ):
        params = list(model.parameters())
        _check_arguments(params, lr, betas, eps, weight_decay, grad_accum)
        self.module = model
        self.strategy = parse_strategy(strategy)
        self.comm = Comm(topo, collective, timer)
        self.timer = self.comm.timer  # forward, backward and the collectives; off without one
        self.topo = topo
        # lr is validated here; step() takes the scheduled value
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        self.grad_accum = grad_accum
        self.adam_step = 0  # AdamW's bias-correction count; save it with a checkpoint
        self._micro_steps = 0
        rank = dist.get_rank()
        self._group, self._local = topo.node_of(rank), topo.local_rank_of(rank)
        self._params = params
        self._offsets = []
        offset = 0
        for p in params:
            self._offsets.append(offset)
            offset += p.numel()
        self.layout = ShardLayout(offset, topo.nodes, topo.procs_per_node)
        self._full = self._flat_parameters()
        self._init_optimizer_state()
        if self.strategy.params != "N":
            self._free_params()

    def _flat_parameters(self) -> torch.Tensor:
        """One flat buffer holding every parameter (rank 0's initialisation, broadcast); the
        parameters become views into it."""
        params = self._params
        full = torch.zeros(self.layout.padded, dtype=params[0].dtype, device=params[0].device)
        with torch.no_grad():
            for p, off in zip(params, self._offsets, strict=True):
                full[off : off + p.numel()].copy_(p.reshape(-1))
        dist.broadcast(full, src=0)  # every rank starts from rank 0's initialisation
        for p, off in zip(params, self._offsets, strict=True):
            p.data = full[off : off + p.numel()].view_as(p)
        return full

    def _init_optimizer_state(self) -> None:
        """This rank's shards: parameters, fp32 master weights, Adam moments, gradients."""
        s, lay, full = self.strategy, self.layout, self._full
        self._param_shard = self._own(full, s.params).clone() if s.params != "N" else None
        # fp32 parameters are their own master weights: the optimizer's shard is a view into
        # the parameter shard (the nested layout puts it inside); other dtypes keep a copy
        self._master_is_param = full.dtype == torch.float32
        if self._master_is_param:
            param_storage = full if s.params == "N" else self._param_shard
            base = lay.start(s.params, self._group, self._local)
            start = lay.start(s.optim, self._group, self._local) - base
            self._master = param_storage[start : start + lay.size(s.optim)]
        else:
            self._master = self._own(full, s.optim).to(torch.float32, copy=True)
        self._exp_avg = torch.zeros_like(self._master)
        self._exp_avg_sq = torch.zeros_like(self._master)
        self._grad = full.new_zeros(lay.size(s.grads))
        self._local_grad = full.new_zeros(lay.padded)
        # AdamW's weight decay goes to matrices only: the shard's runs with it, and without
        with_decay, without = _split(self._owned_ranges(lambda p: p.ndim >= 2, s.optim),
                                     self._master.numel())
        self._adam_groups = [(runs, decay) for runs, decay in
                             ((with_decay, self.weight_decay), (without, 0.0)) if runs]

    # ---- the training loop's interface -------------------------------------------------

    def set_weight_decay(self, weight_decay: float) -> None:
        """AdamW's decay from the next step on (a live `set`); still for matrices only."""
        self.weight_decay = weight_decay
        self._adam_groups = [(runs, weight_decay if decay else 0.0)
                             for runs, decay in self._adam_groups]

    def forward_backward(self, input_ids: torch.Tensor, labels: torch.Tensor,
                         weight: Fraction | None = None) -> Any:
        """One micro-step: forward, backward of loss x `weight`, the micro-step collectives.

        `weight` is the micro-batch's part of this rank's gradient, which the reduction then
        divides by the world size: 1 / grad_accum (the default) when the ranks share the batch
        evenly; its samples x world size / global batch when they do not (a rebalanced
        straggler: the spec's correctness rule, so every strategy's reduction stays a plain sum).
        """
        weight = weight if weight is not None else Fraction(1, self.grad_accum)
        if self._micro_steps == self.grad_accum:
            raise RuntimeError(
                f"forward_backward() called {self._micro_steps + 1} times before step(); "
                f"grad_accum is {self.grad_accum}"
            )
        if self._micro_steps == 0:
            self.comm.reset()  # comm_stats() covers one optimizer step
        self._gather_params()
        with self.timer.op("forward"):
            output = self.module(input_ids, labels)
        self._free_params()
        self._gather_params()
        with self.timer.op("backward"):
            (output.loss * weight.numerator / weight.denominator).backward()
        grad = self._take_local_grad()
        self._free_params()
        level = self.strategy.grads
        if level == "I":
            grad = self.comm.reduce_scatter("intra", grad)
        elif level == "G":
            grad = self.comm.global_reduce_scatter(grad)
        self._grad += grad
        self._micro_steps += 1
        return output

    def step(self, lr: float, grad_clip: float) -> float:
        """The accumulation boundary; returns the global gradient norm before clipping.

        grad_clip <= 0 disables clipping.
        """
        if self._micro_steps != self.grad_accum:
            raise RuntimeError(
                f"step() after {self._micro_steps} forward_backward() calls; "
                f"grad_accum is {self.grad_accum}"
            )
        s, comm = self.strategy, self.comm
        grad = self._grad
        if (s.grads, s.optim) == ("N", "N"):
            grad = comm.global_all_reduce(grad)
        elif (s.grads, s.optim) == ("N", "G"):
            grad = comm.global_reduce_scatter(grad)
        elif (s.grads, s.optim) == ("I", "I"):
            # NII all-reduces in fp32 (spec section 5; its Adam runs R times on the result)
            grad = comm.all_reduce("inter", grad.float() if s.params == "N" else grad)
        elif (s.grads, s.optim) == ("I", "G"):
            grad = comm.reduce_scatter("inter", grad)
        grad = grad.float().div_(self.topo.world_size)

        # The global norm sums each element once: over the world for G shards, over the
        # group for I shards (identical in every group), locally for replicated N.
        norm_sq = grad.pow(2).sum()
        if s.optim in ("G", "I"):
            group, members = (("global", self.topo.world_size) if s.optim == "G"
                              else ("intra", self.topo.procs_per_node))
            with self.timer.op(f"grad_norm.{group}", kind="collective", nbytes=4, group=group,
                               algo="native", collective="all_reduce", group_size=members):
                dist.all_reduce(norm_sq, group=self.topo.intra if s.optim == "I" else None)
        norm = float(norm_sq.sqrt())
        if grad_clip > 0 and math.isfinite(norm):
            grad.mul_(min(1.0, grad_clip / (norm + 1e-6)))
        self._adamw(grad, lr)
        self._sync_params()
        self._grad.zero_()
        self._micro_steps = 0
        return norm

    def discard(self) -> None:
        """Drop the gradients accumulated since the last step() without stepping (the fault
        policy's skip_update, retry_step, rollback and pause)."""
        for p in self._params:
            p.grad = None
        self._grad.zero_()
        self._micro_steps = 0

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds persistently for parameters, gradients and optimizer states."""
        params = self._full if self.strategy.params == "N" else self._param_shard
        optim = (self._exp_avg, self._exp_avg_sq)
        optim += () if self._master_is_param else (self._master,)
        return {
            "params": _nbytes(params),
            "grads": _nbytes(self._grad),
            "optim": sum(_nbytes(t) for t in optim),
        }

    def comm_stats(self) -> dict[str, int]:
        """Bytes sent and collectives called per tier by this rank in the last optimizer step
        (the bulk collectives of the schedule; the scalar grad-norm all-reduce is not counted)."""
        return self.comm.stats.as_dict()

    def sharded_state(self) -> dict[str, tuple[torch.Tensor, int, int]]:
        """{kind: (values, global offset, global length)} for params (fp32 master), exp_avg and
        exp_avg_sq. Each rank returns its global block, so the world's pieces tile the buffer
        exactly once whatever the strategy. The values are views of the live buffers (a checkpoint
        save copies them before it returns); copy them to keep them past the next step."""
        lo, hi = self.layout.real_range("G", self._group, self._local)
        base = self.layout.start(self.strategy.optim, self._group, self._local)
        return {
            kind: (t[lo - base : hi - base], lo, self.layout.numel)
            for kind, t in self._optimizer_buffers().items()
        }

    def load_sharded_state(self, read: Callable[[str, int, int], torch.Tensor]) -> None:
        """Fill this rank's shards from a checkpoint; `read(kind, offset, length)` returns the
        global elements [offset, offset + length) of a kind. Set `adam_step` separately."""
        s, lay = self.strategy, self.layout
        for kind, target in self._optimizer_buffers().items():
            target.copy_(self._read_padded(read, kind, s.optim, target.numel()))
        params = self._full if s.params == "N" else self._param_shard
        params.copy_(self._read_padded(read, "params", s.params, lay.size(s.params)))
        self._grad.zero_()
        self._micro_steps = 0

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[nn.Module]:
        """Gather the parameters for use outside a training step (evaluation, export)."""
        self._gather_params()
        try:
            yield self.module
        finally:
            self._free_params()

    # ---- internals ---------------------------------------------------------------------

    def _optimizer_buffers(self) -> dict[str, torch.Tensor]:
        return dict(zip(STATE_KINDS, (self._master, self._exp_avg, self._exp_avg_sq), strict=True))

    def _own(self, full: torch.Tensor, level: str) -> torch.Tensor:
        start = self.layout.start(level, self._group, self._local)
        return full[start : start + self.layout.size(level)]

    def _owned_ranges(self, predicate: Callable[[nn.Parameter], bool], level: str) -> list[slice]:
        """Slices of this rank's level-`level` shard covering parameters that satisfy predicate."""
        base, size = self.layout.start(level, self._group, self._local), self.layout.size(level)
        ranges = []
        for p, off in zip(self._params, self._offsets, strict=True):
            lo, hi = max(off, base), min(off + p.numel(), base + size)
            if lo < hi and predicate(p):
                ranges.append(slice(lo - base, hi - base))
        return ranges

    def _read_padded(self, read: Callable, kind: str, level: str, size: int) -> torch.Tensor:
        lo, hi = self.layout.real_range(level, self._group, self._local)
        out = torch.zeros(size)
        if hi > lo:
            values = read(kind, lo, hi - lo)
            if values.numel() != hi - lo:
                raise ValueError(
                    f"read({kind!r}, {lo}, {hi - lo}) returned {values.numel()} elements"
                )
            out[: hi - lo] = values.reshape(-1)
        return out

    def _gather_params(self) -> None:
        level = self.strategy.params
        if level == "N":
            return
        self._full.untyped_storage().resize_(self.layout.padded * self._full.element_size())
        if level == "G":
            self.comm.global_all_gather(self._param_shard, out=self._full)
        else:
            self.comm.all_gather("intra", self._param_shard, out=self._full)

    def _free_params(self) -> None:
        if self.strategy.params != "N":
            self._full.untyped_storage().resize_(0)

    def _take_local_grad(self) -> torch.Tensor:
        """This micro-step's gradients as one flat buffer (reused every micro-step: a fresh one
        of the model's size would page-fault its way in each time); the padding stays zero."""
        grad = self._local_grad
        for p, off in zip(self._params, self._offsets, strict=True):
            if p.grad is not None:
                grad[off : off + p.numel()].copy_(p.grad.reshape(-1))
                p.grad = None
            else:
                grad[off : off + p.numel()].zero_()
        return grad

    @torch.no_grad()
    def _adamw(self, grad: torch.Tensor, lr: float) -> None:
        """torch.optim.AdamW on the owned fp32 shard, weight decay only on matrices (ndim >= 2)
        as nanoGPT does, with torch's fused kernel: one pass over the shard instead of seven
        (the tiny model's shard on one CPU thread: 10 ms instead of 96)."""
        self.adam_step += 1
        beta1, beta2 = self.betas
        for runs, decay in self._adam_groups:
            adamw([self._master[r] for r in runs], [grad[r] for r in runs],
                  [self._exp_avg[r] for r in runs], [self._exp_avg_sq[r] for r in runs], [],
                  # the kernel counts each tensor's step up by one before it uses it
                  [torch.tensor(float(self.adam_step - 1), device=grad.device) for _ in runs],
                  fused=True, amsgrad=False, maximize=False, beta1=beta1, beta2=beta2, lr=lr,
                  weight_decay=decay, eps=self.eps)

    @torch.no_grad()
    def _sync_params(self) -> None:
        """Bring the updated master shard back to the parameters' level."""
        s, comm = self.strategy, self.comm
        if s.params == s.optim and self._master_is_param:
            return  # AdamW updated the parameters in place
        # a copy, also when the master is a view: the gathers below write over its storage
        values = self._master.to(self._full.dtype, copy=True)
        if s.params == s.optim:
            (self._full if s.params == "N" else self._param_shard).copy_(values)
        elif (s.params, s.optim) == ("N", "G"):
            comm.global_all_gather(values, out=self._full)
        elif (s.params, s.optim) == ("N", "I"):
            comm.all_gather("intra", values, out=self._full)
        elif (s.params, s.optim) == ("I", "G"):
            comm.all_gather("inter", values, out=self._param_shard)
        else:
            raise AssertionError(f"no parameter sync from os={s.optim} to p={s.params}")


def _split(ranges: list[slice], size: int) -> tuple[list[slice], list[slice]]:
    """[0, size) cut into maximal runs inside `ranges` (sorted, disjoint) and outside them."""
    inside: list[slice] = []
    outside: list[slice] = []
    at = 0
    for r in ranges:
        if r.start > at:
            outside.append(slice(at, r.start))
        if inside and inside[-1].stop == r.start:
            inside[-1] = slice(inside[-1].start, r.stop)
        else:
            inside.append(r)
        at = r.stop
    if at < size:
        outside.append(slice(at, size))
    return inside, outside


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
