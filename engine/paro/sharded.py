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

The step costs a few passes over flat buffers whatever the parameter count: every parameter's
`.grad` is a view into the flat gradient buffer, so backward accumulates into it in place
(level g = N: straight into the accumulator); the global norm is one reduction of the buffer;
the average and the clip are folded into the fused AdamW's gradient scale; the master shard
goes back to the parameters in one conversion into their flat buffer, which the parameter
gathers then fill in place around it.
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
        # backward's target: the accumulator itself when it is replicated, else a full buffer
        # that each micro-step reduces to level g
        self._local_grad = self._grad if s.grads == "N" else full.new_zeros(lay.padded)
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
                         weight: Fraction | None = None,
                         doc_ids: torch.Tensor | None = None) -> Any:
        """One micro-step: forward, backward of loss x `weight`, the micro-step collectives.

        `doc_ids`, when given, go to the module (packed documents masked apart).
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
            output = (self.module(input_ids, labels) if doc_ids is None
                      else self.module(input_ids, labels, doc_ids=doc_ids))
        self._free_params()
        self._gather_params()
        self._attach_grads()
        with self.timer.op("backward"):
            (output.loss * weight.numerator / weight.denominator).backward()
        self._free_params()
        level = self.strategy.grads
        if level != "N":
            grad = (self.comm.reduce_scatter("intra", self._local_grad) if level == "I"
                    else self.comm.global_reduce_scatter(self._local_grad))
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
        norm = self._global_norm(grad) / self.topo.world_size
        clip = min(1.0, grad_clip / (norm + 1e-6)) if grad_clip > 0 and math.isfinite(norm) else 1.0
        # the average over ranks and the clip: AdamW divides the gradient by this as it reads it
        self._adamw(grad.float(), lr, grad_scale=self.topo.world_size / clip)
        self._sync_params()
        self._grad.zero_()
        self._micro_steps = 0
        return norm

    def discard(self) -> None:
        """Drop the gradients accumulated since the last step() without stepping (the fault
        policy's skip_update, retry_step, rollback and pause)."""
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

    def _attach_grads(self) -> None:
        """Every parameter's `.grad` a view into the flat buffer backward writes: autograd then
        accumulates into it in place, one flat buffer instead of a tensor per parameter and a
        copy of each. Attached before every backward, as code outside (a zero_grad) may have
        dropped them. A buffer reduced every micro-step starts from zero; the padding stays
        zero."""
        if self.strategy.grads != "N":
            self._local_grad.zero_()
        grad = self._local_grad
        for p, off in zip(self._params, self._offsets, strict=True):
            p.grad = grad[off : off + p.numel()].view_as(p)

    def _global_norm(self, grad: torch.Tensor) -> float:
        """The gradient's global norm: one fp32 reduction of this rank's buffer, summed over the
        world for G shards, over the group for I shards (identical in every group), local for
        replicated N, so each element counts once."""
        s = self.strategy
        norm_sq = _sum_of_squares(grad)
        if s.optim in ("G", "I"):
            group, members = (("global", self.topo.world_size) if s.optim == "G"
                              else ("intra", self.topo.procs_per_node))
            with self.timer.op(f"grad_norm.{group}", kind="collective", nbytes=4, group=group,
                               algo="native", collective="all_reduce", group_size=members):
                dist.all_reduce(norm_sq, group=self.topo.intra if s.optim == "I" else None)
        return float(norm_sq.sqrt())

    @torch.no_grad()
    def _adamw(self, grad: torch.Tensor, lr: float, grad_scale: float) -> None:
        """torch's fused AdamW kernel on the owned fp32 shard, reading `grad / grad_scale`: one
        pass over the flat buffers (the maximal runs with and without weight decay, which goes
        to matrices only (ndim >= 2) as nanoGPT does), not one tensor per parameter."""
        self.adam_step += 1
        beta1, beta2 = self.betas
        # the kernel reads the step count (functional adamw counts it up first) and the scale
        # from tensors on the shard's device
        step = torch.tensor(float(self.adam_step), device=grad.device)
        scale = torch.tensor(grad_scale, dtype=torch.float32, device=grad.device)
        for runs, decay in self._adam_groups:
            torch._fused_adamw_(
                [self._master[r] for r in runs], [grad[r] for r in runs],
                [self._exp_avg[r] for r in runs], [self._exp_avg_sq[r] for r in runs], [],
                [step] * len(runs), lr=lr, beta1=beta1, beta2=beta2, weight_decay=decay,
                eps=self.eps, amsgrad=False, maximize=False, grad_scale=scale, found_inf=None)

    @torch.no_grad()
    def _sync_params(self) -> None:
        """Bring the updated master shard back to the parameters' level: one conversion into
        this rank's place in the parameter buffer, which the gathers then fill in place."""
        s, lay, comm = self.strategy, self.layout, self.comm
        if s.params == s.optim and self._master_is_param:
            return  # AdamW updated the parameters in place
        target = self._full if s.params == "N" else self._param_shard
        start = (lay.start(s.optim, self._group, self._local)
                 - lay.start(s.params, self._group, self._local))
        own = target[start : start + lay.size(s.optim)]
        if not self._master_is_param:  # an fp32 master is that place already
            own.copy_(self._master)
        if s.params == s.optim:
            return
        if (s.params, s.optim) == ("N", "G"):
            comm.global_all_gather(own, out=self._full)
        elif (s.params, s.optim) == ("N", "I"):
            comm.all_gather("intra", own, out=self._full)
        elif (s.params, s.optim) == ("I", "G"):
            comm.all_gather("inter", own, out=self._param_shard)
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


def _sum_of_squares(flat: torch.Tensor, row: int = 4096) -> torch.Tensor:
    """The fp32 sum of squares of a flat buffer in one pass and no temporary of its size.
    By rows, then over the rows' norms: a single vector_norm (or dot) of a buffer of millions
    accumulates so long on a CPU that its error reaches 1e-4 (1e-3 at 20M elements), where
    the rows' norms keep pow(2).sum()'s accuracy at a tenth of its time."""
    rows = flat.numel() // row
    norms = torch.linalg.vector_norm(flat[: rows * row].view(rows, row), dim=1,
                                     dtype=torch.float32)
    tail = torch.linalg.vector_norm(flat[rows * row :], dtype=torch.float32)
    return norms.square().sum() + tail.square()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
