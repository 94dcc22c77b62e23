"""The training loop, run once per rank: the one place where the engine's parts meet.

`Trainer(spec, run_dir, events).fit()` builds the model, the data loaders and the data-parallel
wrapper, then runs optimizer steps. Every rank runs the same code; rank 0 publishes events
(`state`, `step`, `experts`) and draws the progress bar. Decisions that must agree across
ranks are taken from all-reduced values only, so every rank acts at the same step.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from engine.horing import Topology
from engine.moe import MoEModel
from engine.runtime.data import DataError, TokenLoader, load_tokens
from engine.runtime.events import EventLog
from engine.runtime.spec import JobSpec, TrainSpec


def lr_at(step: int, train: TrainSpec) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to `min_lr_ratio`·lr (1-based)."""
    if step <= train.warmup:
        return train.lr * step / max(1, train.warmup)
    progress = min(1.0, (step - train.warmup) / max(1, train.steps - train.warmup))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return train.lr * (train.min_lr_ratio + (1.0 - train.min_lr_ratio) * cosine)


@dataclass
class StepMetrics:
    step: int
    loss: float
    grad_norm: float
    lr: float
    tokens_per_s: float
    step_time: float
    tokens: int
    rss_bytes: int
    eval_loss: float | None = None

    def event_fields(self) -> dict:
        fields = {
            "loss": self.loss, "grad_norm": self.grad_norm, "lr": self.lr,
            "tokens_per_s": self.tokens_per_s, "step_time": self.step_time,
            "tokens": self.tokens, "memory": {"rss_bytes": self.rss_bytes},
        }
        if self.eval_loss is not None:
            fields["eval_loss"] = self.eval_loss
        return fields


def init_distributed(device: str) -> tuple[int, int, torch.device]:
    """Join the process group described by the launcher's environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT); gloo on CPU, NCCL on GPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), dev


class ReplicatedDataParallel:
    """Every rank holds the whole model; gradients are averaged with one flat all-reduce.

    This is the foundation's data parallelism (PaRO's NNN without sharding); the interface is
    the one engine.paro's strategies implement.
    """

    def __init__(self, model: torch.nn.Module, train: TrainSpec, grad_accum: int):
        self.module = model
        self.grad_accum = grad_accum
        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": train.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=train.lr, betas=(0.9, 0.95), eps=1e-8,
        )
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
        self._micro_steps = 0

    def forward_backward(self, input_ids: torch.Tensor, labels: torch.Tensor):
        output = self.module(input_ids, labels)
        (output.loss / self.grad_accum).backward()
        self._micro_steps += 1
        return output

    def step(self, lr: float, grad_clip: float) -> float:
        if self._micro_steps != self.grad_accum:
            raise RuntimeError(
                f"step() after {self._micro_steps} micro-steps; grad_accum is {self.grad_accum}"
            )
        self._micro_steps = 0
        params = [p for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            params, grad_clip if grad_clip > 0 else float("inf")
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)


class ProgressBar:
    """One line on stderr: step, loss, tokens/s; redrawn in place on a terminal."""

    def __init__(self, total: int):
        self.total = total
        self.tty = sys.stderr.isatty()
        self.every = 1 if self.tty else max(1, total // 20)

    def update(self, m: StepMetrics) -> None:
        if not self.tty and m.step % self.every and m.step != self.total:
            return
        width = 24
        filled = int(width * m.step / self.total)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] step {m.step}/{self.total} "
            f"loss {m.loss:.4f} tok/s {m.tokens_per_s:,.0f} lr {m.lr:.2e}"
        )
        if m.eval_loss is not None:
            line += f" eval {m.eval_loss:.4f}"
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        if self.tty and m.step == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


class Trainer:
    def __init__(self, spec: JobSpec, run_dir: Path, events: EventLog | None = None):
        self.spec = spec
        self.run_dir = run_dir
        t = spec.train
        self.rank, self.world_size, self.device = init_distributed(t.device)
        if self.world_size != spec.parallel.world_size:
            raise ValueError(
                f"parallel: the spec asks for {spec.parallel.world_size} ranks but "
                f"{self.world_size} were launched"
            )
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world_size)))
        torch.set_num_threads(t.threads or max(1, (os.cpu_count() or 1) // local_world))
        self.topo = Topology.from_parallel(spec.parallel).init_groups()
        self.events = events if self.rank == 0 else None

        splits = load_tokens(t.dataset)
        if splits.vocab_size > spec.model.vocab_size:
            raise DataError(
                f"model.vocab_size: {spec.model.vocab_size} is smaller than the tokenizer's "
                f"vocabulary ({splits.vocab_size})"
            )
        self.loader = TokenLoader(
            splits.train, t.seq_len, t.micro_batch, self.rank, self.world_size, t.seed
        )
        self.eval_tokens = splits.heldout

        torch.manual_seed(t.seed)  # identical initial weights on every rank
        self.model = MoEModel(spec.model).to(self.device)
        self.dp = ReplicatedDataParallel(self.model, t, t.grad_accum)
        self.step = 0
        self.tokens = 0
        self._process = psutil.Process()

    # -- one optimizer step -------------------------------------------------------------
    def train_step(self) -> StepMetrics:
        t = self.spec.train
        started = time.perf_counter()
        self.step += 1
        self.model.set_step(self.step)
        self.model.reset_routing_counts()
        ce_sum = torch.zeros((), device=self.device)
        for _ in range(t.grad_accum):
            input_ids, labels = self.loader.next_batch()
            output = self.dp.forward_backward(input_ids.to(self.device), labels.to(self.device))
            ce_sum += output.ce_loss.detach()
        lr = lr_at(self.step, t)
        grad_norm = self.dp.step(lr, t.grad_clip)

        # one all-reduce carries the loss and the routing counts of every MoE layer
        counts = self.model.routing_counts().to(self.device)
        packed = torch.cat([(ce_sum / t.grad_accum).reshape(1), counts.reshape(-1)]).float()
        dist.all_reduce(packed)
        loss = float(packed[0]) / self.world_size
        counts = packed[1:].view_as(counts)
        self.model.update_expert_bias(counts)
        rss = torch.tensor([self._process.memory_info().rss], dtype=torch.float64)
        dist.all_reduce(rss, op=dist.ReduceOp.MAX)

        step_tokens = t.micro_batch * t.seq_len * t.grad_accum * self.world_size
        self.tokens += step_tokens
        step_time = time.perf_counter() - started
        metrics = StepMetrics(
            step=self.step, loss=loss, grad_norm=grad_norm, lr=lr,
            tokens_per_s=step_tokens / step_time, step_time=step_time, tokens=self.tokens,
            rss_bytes=int(rss.item()),
        )
        if t.eval_every and (self.step % t.eval_every == 0 or self.step == t.steps):
            metrics.eval_loss = self.evaluate()
        if self.events is not None:
            self.events.emit("step", self.step, **metrics.event_fields())
            self.events.emit("experts", self.step, layers=self.model.expert_stats(counts))
        return metrics

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean cross-entropy (nats per token) over the first `eval_batches` held-out
        micro-batches, the same windows every time."""
        t = self.spec.train
        loader = TokenLoader(
            self.eval_tokens, t.seq_len, t.micro_batch, self.rank, self.world_size, t.seed,
            shuffle=False,
        )
        self.model.eval()
        total = torch.zeros((), device=self.device)
        for _ in range(t.eval_batches):
            input_ids, labels = loader.next_batch()
            total += self.model(input_ids.to(self.device), labels.to(self.device)).ce_loss
        self.model.train()
        dist.all_reduce(total)
        return float(total) / (t.eval_batches * self.world_size)

    def fit(self) -> list[StepMetrics]:
        if self.events is not None:
            self.events.emit(
                "state", self.step, state="running", world_size=self.world_size,
                device=str(self.device),
                params=sum(p.numel() for p in self.model.parameters()),
            )
        bar = ProgressBar(self.spec.train.steps) if self.rank == 0 else None
        history = []
        while self.step < self.spec.train.steps:
            metrics = self.train_step()
            history.append(metrics)
            if bar is not None:
                bar.update(metrics)
        return history
