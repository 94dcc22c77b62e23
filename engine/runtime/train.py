"""The training loop, run once per rank: the one place where the engine's parts meet.

`Trainer(spec, run_dir, events).fit()` builds the model, the data loaders and the data-parallel
wrapper, then runs optimizer steps. Every rank runs the same code; rank 0 publishes events
(`state`, `step`, `experts`) and draws the progress bar. Decisions that must agree across
ranks are taken from all-reduced values only, so every rank acts at the same step.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from torch import nn

from engine.anomaly import Anomaly, Decision, FaultInjector, FaultManager
from engine.checkpoint import Checkpointer, CheckpointReader, inspect, list_checkpoints, restore
from engine.checkpoint.layout import step_dir_name
from engine.horing import Topology
from engine.horing.cost import calibrate
from engine.moe import MoEModel, cast_parameters
from engine.moe.model import (
    Attention,
    LMHead,
    ModelOutput,
    RMSNorm,
    RoutedExperts,
    SwiGLU,
)
from engine.moe.router import Router
from engine.paro import ShardedDataParallel, plan
from engine.runtime.control import Command, ControlChannel
from engine.runtime.data import DataError, TokenLoader, load_tokens
from engine.runtime.events import EventLog
from engine.runtime.spec import JobSpec, SpecError, TrainSpec, parse_spec, with_layout
from engine.xputimer import (
    HangWatchdog,
    MetricsServer,
    OpAggregator,
    OpTimer,
    StepTimings,
    time_modules,
    write_trace,
)
from engine.xputimer.system import SystemSampler

EXIT_HANG = 87  # a rank's watchdog ended it; the launcher restarts the ranks

# the model's parts timed on every forward (XPUTimer's op classes)
TIMED_MODULES = {Attention: "matmul", Router: "compute", RoutedExperts: "matmul",
                 SwiGLU: "matmul", RMSNorm: "compute", LMHead: "matmul",
                 nn.CrossEntropyLoss: "compute"}


def matrix_weights(module: nn.Module) -> int:
    """The number of weights in a module's matrices (what its matmuls multiply by)."""
    return sum(p.numel() for p in module.parameters() if p.dim() >= 2)


def forward_flops(module: nn.Module, args: tuple, top_k: int, weights: int) -> int:
    """FLOPs of one forward call of a timed matmul module with `weights` matrix weights: 2 per
    multiply-add (a token meets every one of a dense module's and `top_k` experts' worth of a
    routed module's), plus the causal score and value products of attention."""
    x = args[0]
    tokens = x.numel() // x.shape[-1]
    if isinstance(module, RoutedExperts):
        experts = module.gate_up.shape[0]
        return 2 * tokens * top_k * weights // experts
    flops = 2 * tokens * weights
    if isinstance(module, Attention):
        seq = x.shape[-2]
        flops += 2 * tokens * seq * module.heads * module.head_dim  # (QK^T + PV) / 2, causal
    return flops


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
    MASTER_ADDR, MASTER_PORT); gloo on CPU. On GPU, NCCL carries the CUDA tensors and gloo
    the small CPU ones that the control, anomaly and checkpoint agreements exchange."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
            is_master=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0,
        )
        # The launcher's store outlives a restart of the ranks: each incarnation gets its own
        # key space, or a restarted rank may read the address of a rank that has died.
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group("cuda:nccl,cpu:gloo" if device == "cuda" else "gloo",
                                store=dist.PrefixStore(f"ringside/{restart}", store),
                                rank=rank, world_size=world)
    return dist.get_rank(), dist.get_world_size(), dev


def param_dtype(device: torch.device) -> torch.dtype:
    """The parameters' dtype: bf16 on GPU, with fp32 master weights and Adam moments in the
    sharded optimizer (and the grouped-matmul dispatch, whose CUDA kernels take bf16 only);
    fp32 on CPU, the setting of the CPU benchmarks and convergence checks."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def choose_strategy(spec: JobSpec, topo: Topology, device: torch.device) -> str:
    """The spec's PaRO strategy, or for `auto` the planner's first pick for this model, the
    measured links and the memory of one device. Rank 0 decides; every rank gets its answer."""
    if spec.parallel.strategy != "auto":
        return spec.parallel.strategy
    links = calibrate(topo)
    if device.type == "cuda":
        budget = torch.cuda.get_device_properties(device).total_memory
    else:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(topo.world_size)))
        budget = psutil.virtual_memory().total // local_world
    rows = plan(spec.model, topo, budget, spec.train.grad_accum, links,
                dtype_bytes=param_dtype(device).itemsize, collective=spec.parallel.collective)
    choice = [rows[0].strategy]
    dist.broadcast_object_list(choice, src=0)
    return choice[0]


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
    """One rank's training run. `resume_from` names checkpoint folders to continue from (the
    newest good checkpoint in them wins; its layout may differ from this run's)."""

    def __init__(
        self, spec: JobSpec, run_dir: Path, events: EventLog | None = None,
        resume_from: list[Path] | None = None, control: ControlChannel | None = None,
        metrics_port: int | None = None,
    ):
        self.spec = spec
        self.run_dir = run_dir
        t, p = spec.train, spec.parallel
        self.rank, self.world_size, self.device = init_distributed(t.device)
        if self.world_size != p.world_size:
            raise ValueError(
                f"parallel: the spec asks for {p.world_size} ranks but "
                f"{self.world_size} were launched"
            )
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world_size)))
        torch.set_num_threads(t.threads or max(1, (os.cpu_count() or 1) // local_world))
        self.topo = Topology.from_parallel(p).init_groups()
        self.events = events if self.rank == 0 else None
        self.step = 0  # optimizer steps done
        self.tokens = 0
        self.control = control if self.rank == 0 else None
        self._pending: list[Command] = []  # rank 0: commands read, not yet broadcast
        self._commands_due = 0  # how many of them every rank acts on after this step

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

        self.strategy = choose_strategy(spec, self.topo, self.device)
        torch.manual_seed(t.seed)  # identical initial weights on every rank
        self.model = cast_parameters(MoEModel(spec.model).to(self.device),
                                     param_dtype(self.device))
        # timing and fault handling: every rank times its own ops and runs the detectors;
        # aggregation and decisions are collective, so all ranks act alike
        self.timer = OpTimer(self.rank, backend=self.device.type, sample_every=t.trace_every)
        self.dp = ShardedDataParallel(
            self.model, self.topo, self.strategy, lr=t.lr, weight_decay=t.weight_decay,
            grad_accum=t.grad_accum, collective=p.collective, timer=self.timer,
        )
        self.ckpt = Checkpointer(
            spec.checkpoint.dir or run_dir / "checkpoints",
            rank=self.rank, world_size=self.world_size, keep=spec.checkpoint.keep,
            every=spec.checkpoint.every, memory_every=spec.checkpoint.memory_every,
            memory_dir="auto" if spec.checkpoint.memory_every > 0 else None,
            meta={"strategy": self.strategy, "nodes": p.nodes, "procs_per_node": p.procs_per_node,
                  "name": spec.name},
        )
        self._module_timing: list = []
        self.set_timing(True)
        self.aggregator = OpAggregator()
        self.metrics_server = None
        if self.rank == 0 and metrics_port is not None:  # Prometheus text, for a Grafana
            self.metrics_server = MetricsServer(metrics_port, job=spec.name).start()
            self._emit("log", level="info", message=f"metrics at {self.metrics_server.url}")
        self.faults = FaultManager(spec.faults.policy, self.rank)
        self.injector = FaultInjector(spec.faults.inject, self.rank, state_dir=run_dir / "faults")
        self.model.register_forward_hook(self._inject_loss_faults)
        self.watchdog = HangWatchdog(self.timer, spec.faults.policy.hang_timeout_s,
                                     run_dir / "hangs", on_hang=self._on_hang)
        self._signals: dict = {}  # the previous step's throughput, memory, ops and experts
        self._trace_next = False
        if (run_dir / "faults").is_dir():
            self._publish_hang_reports()
        self.system = SystemSampler(self.device)
        if resume_from:
            self.resume(resume_from)

    # -- checkpoints ----------------------------------------------------------------------
    def _extras(self) -> dict:
        params = {name for name, _ in self.model.named_parameters()}
        return {
            "step": self.step,
            "tokens": self.tokens,
            "adam_step": self.dp.adam_step,
            "faults": self.faults.state_dict(),
            "loader": self.loader.state_dict(),
            "rng": torch.get_rng_state(),
            # replicated buffers (the MoE expert bias) travel whole
            "buffers": {k: v.clone() for k, v in self.model.state_dict().items()
                        if k not in params},
        }

    def save_checkpoint(self, to_disk: bool = True) -> Path:
        state = self.dp.sharded_state()
        with self.timer.op("checkpoint", kind="host"):  # the blocking part: the copy to host
            blocking_s = self.ckpt.save(self.step, state, self._extras(), to_disk=to_disk)
        directory = self.ckpt.directory if to_disk else self.ckpt.memory_dir
        path = directory / step_dir_name(self.step)
        self._emit(
            "checkpoint", path=str(path), tier="disk" if to_disk else "memory",
            blocking_s=blocking_s,
            size_bytes=sum(length * t.element_size() for t, _, length in state.values()),
            strategy=self.strategy, world_size=self.world_size,
        )
        return path

    def persist(self) -> None:
        """Wait until every rank's queued checkpoints are on disk (before this run exits)."""
        self.ckpt.wait()
        dist.barrier()

    def _load(self, reader: CheckpointReader, live: bool = False) -> None:
        """Take the whole training state from an open checkpoint (any layout); `live` for a
        rollback inside the running job, whose ladder keeps what it just did."""
        self.dp.load_sharded_state(reader.read)
        extras = reader.extras(0)  # the extras hold only facts every rank shares
        self.step, self.tokens = extras["step"], extras["tokens"]
        self.dp.adam_step = extras["adam_step"]
        self.loader.load_state_dict(extras["loader"])
        torch.set_rng_state(extras["rng"])
        self.model.load_state_dict(extras["buffers"], strict=False)
        self.faults.load_state_dict(extras["faults"], ladder=not live)

    def resume(self, sources: list[Path]) -> None:
        """Continue from the newest good checkpoint in `sources` (folders of checkpoints, or
        one checkpoint folder); corrupt ones are skipped, each with an anomaly event."""
        if len(sources) == 1 and (sources[0] / "MANIFEST.json").exists():
            with CheckpointReader(inspect(sources[0])) as reader:
                self._load(reader)
            path = sources[0]
        else:
            restored = restore(sources, self._load)
            for bad in restored.skipped:
                self._emit("anomaly", kind="checkpoint_corrupt", severity="warning", rank=None,
                           evidence={"path": str(bad.path), "problem": bad.problem})
            if restored.checkpoint is None:
                raise FileNotFoundError(
                    f"resume: no good checkpoint in {', '.join(str(d) for d in sources)}"
                )
            path = restored.checkpoint.path
        self._emit("log", level="info", message=f"resumed at step {self.step} from {path}")

    def _emit(self, type: str, **fields: object) -> None:
        if self.events is not None:
            self.events.emit(type, self.step, **fields)

    # -- faults -------------------------------------------------------------------------
    def _inject_loss_faults(self, module: torch.nn.Module, args: tuple, output: ModelOutput):
        """Forward hook: an injected loss spike or NaN shows in the loss that is trained on
        and in the one reported."""
        if not module.training:
            return output
        loss = self.injector.corrupt_loss(self.step, output.loss)
        if loss is output.loss:
            return output
        factor = (loss / output.loss).detach()
        return dataclasses.replace(output, loss=loss, ce_loss=output.ce_loss * factor)

    def _on_hang(self, anomaly: Anomaly) -> None:
        """The watchdog's thread: the training thread is stuck, so nothing collective can run.
        Leave a report for rank 0 to publish, then end this rank: the launcher restarts all
        of them from the newest checkpoint."""
        if anomaly.evidence.get("op_kind") == "collective":
            # Waiting in a collective, this rank is more likely the victim of a hang than its
            # cause: give the stuck rank's own watchdog time to fire first (its exit makes
            # the launcher stop every rank, this one included).
            time.sleep(self.spec.faults.policy.hang_timeout_s)
        reports = self.run_dir / "faults"
        reports.mkdir(parents=True, exist_ok=True)
        report = reports / f"hang-rank{self.rank}-step{anomaly.step}.json"
        report.write_text(json.dumps({"step": anomaly.step, **anomaly.event_fields()},
                                     default=str))
        self._publish_hang_reports()
        os._exit(EXIT_HANG)

    def _publish_hang_reports(self) -> None:
        """Rank 0 publishes every hang report not yet published (its own at once; another
        rank's after the restart), each with the restart it caused."""
        if self.events is None:
            return
        for report in sorted((self.run_dir / "faults").glob("hang-*.json")):
            anomaly = json.loads(report.read_text())
            self.events.emit("anomaly", anomaly["step"], **{k: v for k, v in anomaly.items()
                                                            if k != "step"})
            self.events.emit("action", anomaly["step"], action="restart", anomaly="hang",
                             by="policy", rank=anomaly.get("rank"),
                             reason="the op in flight exceeded hang_timeout_s")
            report.rename(report.with_suffix(".published"))

    def _respond(self, local_loss: float) -> Decision | None:
        """Run the detectors (collective), publish what they found, return the decision to
        carry out (the strongest), if any."""
        # each completed step's signals are judged once; a discarded step leaves none
        prev, self._signals = self._signals, {}
        anomalies, decisions = self.faults.step(
            self.step, loss=local_loss, grad_norm=prev.get("grad_norm"),
            tokens_per_s=prev.get("tokens_per_s"), memory_bytes=prev.get("rss"),
            aggregate=prev.get("ops"), experts=prev.get("experts"),
        )
        self._trace_next = bool(anomalies)  # keep the evidence: the next step's timeline
        for anomaly in anomalies:
            self._emit("anomaly", **anomaly.event_fields())
        for decision in decisions[1:]:  # recorded; the first is announced once carried out
            self._emit("action", **decision.event_fields())
        return decisions[0] if decisions else None

    def _announce(self, decision: Decision | None, **outcome: object) -> None:
        """Publish the decision carried out, with what it did (e.g. the checkpoint)."""
        if decision is not None and self.events is not None:
            self.events.emit("action", decision.step, **decision.event_fields(), **outcome)

    # -- one optimizer step -------------------------------------------------------------
    def train_step(self) -> StepMetrics | None:
        """One optimizer step, or None when the fault policy discarded it."""
        t = self.spec.train
        started = time.perf_counter()
        self.step += 1
        self.injector.crash_point(self.step)
        self.model.set_step(self.step)
        self.model.reset_routing_counts()
        position = self.loader.position
        ce_sum = torch.zeros((), device=self.device)
        for _ in range(t.grad_accum):
            with self.timer.op("data", kind="data"):
                input_ids, labels = self.loader.next_batch()
            with self.timer.op("forward_backward", kind="compute"), \
                    self.injector.slowdown(self.step):
                output = self.dp.forward_backward(input_ids.to(self.device),
                                                  labels.to(self.device))
                self.injector.hang_point(self.step)
            ce_sum += output.ce_loss.detach()

        # the first collective after the forward-backward: where faster ranks wait for a
        # straggler, so it is timed as a collective (untimed waits would look like compute)
        with self._all_reduce_span("fault_agreement", nbytes=16):
            decision = self._respond(float(ce_sum) / t.grad_accum)
        lr = lr_at(self.step, t)
        action = decision.action if decision is not None else "observe"
        if action in ("skip_update", "retry_step", "rollback", "pause", "restart"):
            self.dp.discard()
            if action in ("skip_update", "retry_step"):  # the step number is trained again
                self.step -= 1
                if action == "retry_step":  # on the same data
                    self.loader.position = position
            outcome: dict = {}
            if action == "rollback":
                try:
                    outcome = self.rollback(self.step - 1, None, skip_data=True)
                except CommandRefused as e:  # nothing to go back to yet: the update is skipped
                    self.step -= 1
                    outcome = {"carried_out": "skip_update", "error": str(e)}
            elif action == "pause":
                self._outcome = Outcome("pause", self.step - 1)
                self.step -= 1
                outcome = {"checkpoint": str(self.save_checkpoint())}
                self.persist()
            elif action == "restart":
                self._announce(decision)
                raise RestartRequested(f"step {self.step}: {decision.reason or decision.anomaly}")
            self._announce(decision, **outcome)
            self._end_step_timing()  # after the step count is settled: the timer follows it
            return None
        if action == "lr_cut":
            lr *= float(decision.params.get("lr_factor", 0.1))
        with self.timer.op("optimizer", kind="compute"):
            grad_norm = self.dp.step(lr, t.grad_clip)
        if action == "checkpoint":
            self._announce(decision, checkpoint=str(self.save_checkpoint()))
        elif decision is not None:
            self._announce(decision)

        # One all-reduce carries the loss, the routing counts of every MoE layer and the
        # number of commands rank 0 has read (the others add 0), so steering costs no
        # collective of its own until a command actually arrives.
        if self.control is not None:
            self._pending += self.control.poll()
            for error in self.control.errors:  # malformed commands: say why they are ignored
                self._emit("action", action="refused", command=None, error=error)
            self.control.errors.clear()
        counts = self.model.routing_counts().to(self.device)
        packed = torch.cat([
            (ce_sum / t.grad_accum).reshape(1),
            torch.tensor([float(len(self._pending))], device=self.device),
            counts.reshape(-1),
        ]).float()
        with self._all_reduce_span("metrics_all_reduce", packed.numel() * packed.element_size()):
            dist.all_reduce(packed)
        loss = float(packed[0]) / self.world_size
        self._commands_due = int(packed[1])
        counts = packed[2:].view_as(counts)
        self.model.update_expert_bias(counts)
        # the step event reports the worst rank in one MAX: memory, state bytes, traffic and
        # the step time (a synchronous step is as slow as its slowest rank, and every rank's
        # throughput detector must see the same number to agree on a drop)
        system = self.system.sample()
        rss = int(system["rss_bytes"])
        state, comm = self.dp.state_bytes(), self.dp.comm_stats()
        worst = torch.tensor([time.perf_counter() - started, rss, *state.values(),
                              *comm.values()], dtype=torch.float64)
        with self._all_reduce_span("worst_all_reduce", worst.numel() * worst.element_size()):
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        step_time, *rest = worst.tolist()
        worst_rss, *rest = (int(v) for v in rest)
        state = dict(zip(state, rest[: len(state)], strict=True))
        comm = dict(zip(comm, rest[len(state):], strict=True))

        step_tokens = t.micro_batch * t.seq_len * t.grad_accum * self.world_size
        self.tokens += step_tokens
        metrics = StepMetrics(
            step=self.step, loss=loss, grad_norm=grad_norm, lr=lr,
            tokens_per_s=step_tokens / step_time, step_time=step_time, tokens=self.tokens,
            rss_bytes=worst_rss,
        )
        if t.eval_every and (self.step % t.eval_every == 0 or self.step == t.steps):
            metrics.eval_loss = self.evaluate()
        # every rank's system metrics ride on the timing aggregator's per-step all_gather
        ops = self.aggregator.aggregate(self._end_step_timing(), system)
        per_rank_system = ops.pop("system")
        if self.metrics_server is not None:
            self.metrics_server.update(ops)
        experts = self.model.expert_stats(counts)
        self._signals = {
            "grad_norm": grad_norm, "tokens_per_s": metrics.tokens_per_s, "rss": rss,
            "ops": ops, "experts": {str(i): layer for i, layer in enumerate(experts)},
        }
        self._emit("step", **metrics.event_fields(), state_bytes=state, comm=comm,
                   system=per_rank_system)
        self._emit("experts", layers=experts)
        self._emit("ops", **{k: v for k, v in ops.items() if k != "step"})
        tier = self.ckpt.due(self.step)
        if tier is not None:
            self.save_checkpoint(to_disk=tier == "disk")
        return metrics

    def _all_reduce_span(self, name: str, nbytes: int):
        """The timer's span for one of the loop's own all-reduces over every rank."""
        return self.timer.op(name, kind="collective", nbytes=nbytes, group="global",
                             algo="native", collective="all_reduce",
                             group_size=self.world_size)

    def set_timing(self, enabled: bool) -> None:
        """Per-op timing on or off, the model's module hooks included (on by default; off
        only to measure what timing costs, bench/timing_overhead.py)."""
        for handle in self._module_timing:
            handle.remove()
        self._module_timing = []
        self.timer.enabled = enabled
        if enabled:
            top_k = self.spec.model.num_experts_per_tok
            matmuls = tuple(cls for cls, kind in TIMED_MODULES.items() if kind == "matmul")
            weights = {m: matrix_weights(m) for m in self.model.modules()
                       if isinstance(m, matmuls)}  # counted once, not on every call
            self._module_timing = time_modules(
                self.model, self.timer, TIMED_MODULES,
                lambda m, args: forward_flops(m, args, top_k, weights[m]))

    def _end_step_timing(self) -> StepTimings:
        """Close the step's timings; a sampled step's full timeline goes to a Chrome trace
        (collective: every rank sampled the same step)."""
        timings = self.timer.step_end(self.step)
        if timings.sampled:
            trace = write_trace(self.timer, self.run_dir / "traces" / f"step-{self.step:06d}.json",
                                steps={self.step})
            if trace is not None:
                self._emit("log", level="info", message=f"timeline trace: {trace}",
                           trace=str(trace))
        if self._trace_next:
            self.timer.request_timeline()
            self._trace_next = False
        self.last_timings = timings
        return timings

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean cross-entropy (nats per token) over the first `eval_batches` held-out
        micro-batches, the same windows every time."""
        t = self.spec.train
        loader = TokenLoader(
            self.eval_tokens, t.seq_len, t.micro_batch, self.rank, self.world_size, t.seed,
            shuffle=False,
        )
        total = torch.zeros((), device=self.device)
        with self.dp.full_parameters() as model:
            model.eval()
            for _ in range(t.eval_batches):
                input_ids, labels = loader.next_batch()
                total += model(input_ids.to(self.device), labels.to(self.device)).ce_loss
            model.train()
        dist.all_reduce(total)
        return float(total) / (t.eval_batches * self.world_size)

    # -- commands -------------------------------------------------------------------------
    def _receive_commands(self) -> list[Command]:
        if not self._commands_due:
            return []
        box = [self._pending[: self._commands_due]] if self.rank == 0 else [None]
        dist.broadcast_object_list(box, src=0)
        if self.rank == 0:
            del self._pending[: self._commands_due]
        return box[0]

    def _act(self, command: Command) -> Outcome | None:
        """Carry out one command on every rank; returns how the run ends, if it does."""
        def ack(action: str, **fields: object) -> None:
            self._emit("action", action=action, command=command.id, by="command", **fields)

        kind, args = command.kind, command.args
        if kind == "checkpoint":
            ack("checkpoint", path=str(self.save_checkpoint()))
        elif kind == "rollback":
            ack("rollback", **self.rollback(args.get("step"), args.get("checkpoint"),
                                            bool(args.get("skip_data", False))))
        elif kind in ("pause", "reshard"):
            parallel = None
            if kind == "reshard":
                parallel = {**dataclasses.asdict(self.spec.parallel), **args}
                parse_spec(with_layout(self.spec.to_dict(), parallel))  # refuse bad layouts
                world = parallel["nodes"] * parallel["procs_per_node"]
                if (self.spec.train.micro_batch * self.world_size) % world:
                    raise CommandRefused(
                        f"reshard: the global micro-batch ({self.spec.train.micro_batch} x "
                        f"{self.world_size} sequences) does not divide over {world} ranks"
                    )
            path = self.save_checkpoint()
            self.persist()
            ack(kind, path=str(path), **({"parallel": parallel} if parallel else {}))
            return Outcome(kind, self.step, parallel)
        elif kind == "cancel":
            ack("cancel")
            return Outcome("cancel", self.step)
        else:
            raise CommandRefused(f"{kind}: the job is running; resume applies to a paused job")
        return None

    def rollback(self, step: int | None, checkpoint: str | None, skip_data: bool) -> dict:
        """Go back to a kept checkpoint in-process: the named one, or the newest at or before
        `step`. With skip_data the loader keeps its position, so the window between that
        checkpoint and now is not trained on again."""
        self.ckpt.wait()
        dist.barrier()
        tiers = [d for d in (self.ckpt.memory_dir, self.ckpt.directory) if d is not None]
        good = [c for d in tiers for c in list_checkpoints(d) if c.good]
        if checkpoint:
            chosen = [c for c in good if checkpoint in (c.path.name, str(c.path))]
        else:
            if not isinstance(step, int) or step < 0:
                raise CommandRefused("rollback needs args.step (an integer) or args.checkpoint")
            chosen = [c for c in good if c.step <= step]
        if not chosen:
            raise CommandRefused(f"rollback: no good checkpoint matches {checkpoint or step}")
        target = max(chosen, key=lambda c: c.step)
        from_step, position = self.step, self.loader.position
        with CheckpointReader(target) as reader:
            self._load(reader, live=True)
        if skip_data:
            self.loader.position = position
        self.ckpt.forget_after(self.step)
        # no rank saves the new timeline's first checkpoint while another still deletes the
        # abandoned one's folders (a folder of the same step would be deleted under it)
        dist.barrier()
        return {"checkpoint": str(target.path), "to_step": self.step, "from_step": from_step,
                "skip_data": skip_data}

    def fit(self) -> Outcome:
        self._emit("state", state="running", world_size=self.world_size,
                   device=str(self.device),
                   dtype=str(param_dtype(self.device)).removeprefix("torch."),
                   strategy=self.strategy, params=sum(p.numel() for p in self.model.parameters()))
        bar = ProgressBar(self.spec.train.steps) if self.rank == 0 else None
        self._outcome: Outcome | None = None
        self.watchdog.start()
        while self.step < self.spec.train.steps:
            metrics = self.train_step()
            if self._outcome is not None:  # the fault policy paused the job for a person
                self.finish()
                return self._outcome
            if metrics is None:
                continue
            if bar is not None:
                bar.update(metrics)
            for command in self._receive_commands():
                try:
                    outcome = self._act(command)
                except (CommandRefused, SpecError) as e:
                    self._emit("action", action="refused", command=command.id,
                               kind=command.kind, error=str(e))
                    continue
                if outcome is not None:
                    self.finish()
                    return outcome
        if self.ckpt.due(self.step) != "disk":
            self.save_checkpoint()  # a finished run always leaves its final state on disk
        self.finish(drop_memory_tier=True)
        return Outcome("completed", self.step)

    def finish(self, drop_memory_tier: bool = False) -> None:
        """Stop the watchdog and the metrics endpoint, wait for checkpoint writes."""
        self.watchdog.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if drop_memory_tier:  # the memory tier is shared: no rank drops it while one writes
            self.persist()
        self.ckpt.close(drop_memory_tier=drop_memory_tier)


class RestartRequested(RuntimeError):
    """The fault policy restarts the ranks: this rank exits, the launcher restarts them all
    and they resume from the newest checkpoint."""


class CommandRefused(ValueError):
    """A command that cannot be carried out now; the loop answers it with a `refused` action."""


@dataclass
class Outcome:
    """How a run of the ranks ended: completed, pause, cancel or reshard (to `parallel`)."""

    kind: str
    step: int
    parallel: dict | None = None
