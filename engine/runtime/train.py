"""The training loop, run once per rank: the one place where the engine's parts meet.

`Trainer(spec, run_dir, events).fit()` builds the model, data, data-parallel wrapper and the
loop's components (each owns its config and state: the fault `response` with its `approvals`,
the commands, `telemetry`, checkpoints, the loop's `state`), then runs optimizer steps. Every
rank runs the same code; rank 0 publishes events. Cross-rank decisions use all-reduced values.
"""

from __future__ import annotations

import dataclasses
import os
import time
from fractions import Fraction
from pathlib import Path

import torch
import torch.distributed as dist

from engine.anomaly import FaultInjector, FaultManager
from engine.checkpoint import Checkpointer
from engine.contract import Event, LogEvent, StateEvent, checkpoint_dir
from engine.data.loader import heldout_loaders, training_data
from engine.horing import Topology
from engine.moe import MoEModel, cast_parameters
from engine.moe.model import ModelOutput
from engine.paro import ShardedDataParallel
from engine.runtime.approvals import Approvals
from engine.runtime.checkpointing import TrainCheckpoints
from engine.runtime.commands import CommandHandler, CommandInbox, CommandRefused, Outcome, PauseWait
from engine.runtime.control import ControlChannel
from engine.runtime.distributed import init_distributed, local_world_size, param_dtype
from engine.runtime.events import EventLog
from engine.runtime.hangs import HangReports
from engine.runtime.init_from import load_optimizer, load_weights
from engine.runtime.lineage import Lineage
from engine.runtime.rerun import RngState, attribute, gather_losses, restore_rng, rng_state
from engine.runtime.response import (
    Apply,
    Discard,
    FaultResponse,
    Rerun,
    Rollback,
    Stop,
    Verdict,
)
from engine.runtime.schedule import lr_at
from engine.runtime.settings import SETTINGS_LOG, carry_over
from engine.runtime.spec import JobSpec
from engine.runtime.state import TrainState
from engine.runtime.strategy import choose_strategy
from engine.runtime.telemetry import ProgressBar, StepMetrics, Telemetry
from engine.xputimer import HangWatchdog, MetricsServer, OpTimer, StepTimings


class Trainer:
    """One rank's training run. `resume_from` names checkpoint folders to continue from (the
    newest good checkpoint in them wins; its layout may differ from this run's; a resumed run's
    own checkpoint wins over `model.init_from`)."""

    def __init__(
        self, spec: JobSpec, run_dir: Path, events: EventLog | None = None,
        resume_from: list[Path] | None = None, control: ControlChannel | None = None,
        metrics_port: int | None = None,
    ):
        self.spec, self.run_dir = spec, run_dir
        t, p, policy = spec.train, spec.parallel, spec.faults.policy
        self.rank, self.world_size, self.device = init_distributed(t.device)
        if self.world_size != p.world_size:
            raise ValueError(f"parallel: the spec asks for {p.world_size} ranks but "
                             f"{self.world_size} were launched")
        torch.set_num_threads(
            t.threads or max(1, (os.cpu_count() or 1) // local_world_size(self.world_size)))
        self.topo = Topology.from_parallel(p).init_groups()
        self.events = events if self.rank == 0 else None
        self.loader = training_data(spec, self.rank, self.world_size)
        self.strategy = choose_strategy(spec, self.topo, self.device)
        torch.manual_seed(t.seed)  # identical initial weights on every rank
        self.model = cast_parameters(MoEModel(spec.model).to(self.device),
                                     param_dtype(self.device))
        init_parent = None if resume_from else load_weights(spec, self.model, self.emit)
        # every rank times its own ops and runs the detectors; aggregation and decisions are
        # collective, so all ranks act alike
        self.timer = OpTimer(self.rank, backend=self.device.type, sample_every=t.trace_every)
        self.dp = ShardedDataParallel(
            self.model, self.topo, self.strategy, lr=t.lr, weight_decay=t.weight_decay,
            grad_accum=t.grad_accum, collective=p.collective, timer=self.timer,
        )
        self.faults = FaultManager(policy, self.rank, hosts=p.hosts)
        self.state = TrainState(self.model, self.dp, self.loader, self.faults, spec)
        lineage = Lineage(spec, self.loader.sources, init_parent)
        self.checkpoints = TrainCheckpoints(self._checkpointer(), self.dp, self.state, self.timer,
                                            self.emit, lineage, p.hosts, spec.checkpoint.replicas)
        self.telemetry = Telemetry(
            self.model, self.dp, self.timer, top_k=spec.model.num_experts_per_tok,
            world_size=self.world_size, device=self.device, run_dir=run_dir, emit=self.emit,
            bar=ProgressBar(t.steps) if self.rank == 0 else None,
            metrics=(MetricsServer(metrics_port, job=spec.name)
                     if self.rank == 0 and metrics_port is not None else None),
        )
        self.inbox = CommandInbox(control if self.rank == 0 else None, self.emit)
        self.injector = FaultInjector(spec.faults.inject, self.rank, state_dir=run_dir / "faults")
        self.model.register_forward_hook(self._inject_loss_faults)
        self.hangs = HangReports(run_dir, self.rank, policy.hang_timeout_s, self.emit,
                                 publisher=self.events is not None)
        self.watchdog = HangWatchdog(self.timer, policy.hang_timeout_s, run_dir / "hangs",
                                     on_hang=self.hangs.on_hang)
        wait = PauseWait(self.inbox, self.watchdog)
        self.approvals = Approvals(policy, wait, self.emit)
        self.response = FaultResponse(self.faults, self.emit, self.approvals)
        self.commands = CommandHandler(spec, self.world_size, self.state, self.checkpoints,
                                       self.emit, self.state.settings, wait, self.approvals,
                                       self.state.rebalancer)
        self.hangs.publish()
        self.stopped: Outcome | None = None  # set when the fault policy ends the run
        if resume_from:
            self.checkpoints.resume(resume_from)
        else:
            load_optimizer(spec, self.dp)
        self._carry_over_settings(bool(resume_from))

    def _carry_over_settings(self, resumed: bool) -> None:
        """The live settings in force before this incarnation (after a resume, or a restart
        of the ranks), over a checkpoint older than some `set`
        (engine.runtime.settings.carry_over)."""
        resumed = resumed or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        settings = self.state.settings
        settings.log = self.run_dir / SETTINGS_LOG if self.rank == 0 else None
        again = carry_over(settings, resumed, lambda box: dist.broadcast_object_list(box, src=0))
        if again:
            self.emit(LogEvent(step=self.state.step, level="info", message=(
                "live settings set after the checkpoint applied again: "
                + ", ".join(f"{key}={value}" for key, value in sorted(again.items())))))

    def _checkpointer(self) -> Checkpointer:
        c, p = self.spec.checkpoint, self.spec.parallel
        return Checkpointer(
            checkpoint_dir(c.dir, self.run_dir), rank=self.rank, world_size=self.world_size,
            # the memory tier is always there: a restart the policy asks for snapshots to it
            keep=c.keep, every=c.every, memory_every=c.memory_every, memory_dir="auto",
            mirror_disk_saves=c.memory_every > 0,
            # the spec travels with the checkpoint: an export or a clone needs no other file
            meta={"strategy": self.strategy, "nodes": p.nodes, "procs_per_node": p.procs_per_node,
                  "name": self.spec.name, "spec": self.spec.to_dict()},
            parts={"train": self.state},
        )

    def emit(self, event: Event) -> None:
        if self.events is not None:
            self.events.emit(event)

    def set_timing(self, enabled: bool) -> None:
        """Per-op timing on or off (bench/timing_overhead.py measures what it costs)."""
        self.telemetry.set_timing(enabled)

    @property
    def last_timings(self) -> StepTimings | None:
        return self.telemetry.last_timings

    def _inject_loss_faults(self, module: torch.nn.Module, args: tuple, output: ModelOutput):
        """Forward hook: an injected loss spike or NaN shows in the loss that is trained on
        and in the one reported."""
        if not module.training:
            return output
        loss = self.injector.corrupt_loss(self.state.step, output.loss)
        if loss is output.loss:
            return output
        factor = (loss / output.loss).detach()
        return dataclasses.replace(output, loss=loss, ce_loss=output.ce_loss * factor)

    # -- one optimizer step -------------------------------------------------------------
    def train_step(self) -> StepMetrics | None:
        """One optimizer step, or None when the fault policy discarded it."""
        t, s = self.spec.train, self.state
        started = time.perf_counter()
        s.step += 1
        self.injector.crash_point(s.step)
        self.model.set_step(s.step)
        self.model.reset_routing_counts()
        position, shares, rng = self.loader.position, self.loader.shares, rng_state(self.device)
        ce = self.forward_backward()
        # the first collective after the forward-backward: where faster ranks wait for a
        # straggler, so it is timed as a collective (untimed waits would look like compute)
        with self.telemetry.all_reduce_span("fault_agreement", nbytes=16):
            verdict = self.response.judge(s.step, float(ce))
        if isinstance(verdict, Rerun):
            verdict, ce = self._rerun(verdict, ce, position, rng)
        if not isinstance(verdict, Apply):
            self._drop_update(verdict, position)
            return None
        lr = lr_at(s.step, t) * s.settings.lr_factor * verdict.lr_factor
        with self.timer.op("optimizer", kind="compute"):
            grad_norm = self.dp.step(lr, t.grad_clip)
        outcome = {"checkpoint": str(self.checkpoints.save())} if verdict.checkpoint else {}
        if verdict.rebalance:
            outcome["shares"] = s.rebalancer.engage()
        self.response.announce(verdict, **outcome)
        s.count_source_tokens(self.loader, position)
        # this rank's part of the global mean loss: its mean weighted by its share of the batch
        part = ce * (shares[self.rank] * self.world_size / self.loader.global_batch)
        return self._measure(started, part, grad_norm, lr, shares)

    def forward_backward(self) -> torch.Tensor:
        """Accumulate the gradients of this rank's micro-batches, each weighted by its samples
        (a rebalanced rank's share is uneven); this rank's mean CE loss over them. Each
        sample's loss is kept for its source (`source_sums`: loss sums and sample counts)."""
        loader, ce = self.loader, torch.zeros((), device=self.device)
        self.source_sums = torch.zeros(2, len(loader.sources), device=self.device)
        for micro in range(self.spec.train.grad_accum):
            # the data op is the step's wait on data (the ops event's data_wait_share)
            with self.timer.op("data", kind="data"):
                first = loader.first_sample(micro)
                batch = loader.next_micro_batch(micro)
                labels = self.injector.corrupt_batch(self.state.step, first, batch.labels)
            samples = len(labels)
            # an injected slowdown's wait is the host's (a sleep, no model module's work): the
            # op chart stacks it on its own rather than inside forward
            with self.timer.op("forward_backward", kind="compute"), \
                    self.injector.slowdown(self.state.step,
                                           lambda: self.timer.op("slow_rank", kind="host")):
                output = self.dp.forward_backward(
                    batch.input_ids.to(self.device), labels.to(self.device),
                    weight=Fraction(samples * self.world_size, loader.global_batch),
                    doc_ids=batch.doc_ids)
                self.injector.hang_point(self.state.step)
            ce += output.ce_loss.detach() * (samples / loader.shares[self.rank])
            sources = batch.sources.to(self.device)
            self.source_sums[0].index_add_(0, sources, output.sample_ce.float())
            self.source_sums[1].index_add_(0, sources, torch.ones_like(sources, dtype=torch.float))
        return ce

    def _rerun(self, verdict: Rerun, ce: torch.Tensor, position: int,
               rng: RngState) -> tuple[Verdict, torch.Tensor]:
        """Train the step's micro-batches again from the same state (its parameters, RNG and
        data) and tell a bad batch from a bad step (engine.runtime.rerun): the verdict that
        follows and the loss the step goes on with, the rerun's."""
        self.dp.discard()
        self.loader.position = position
        restore_rng(rng, self.device)
        self.model.reset_routing_counts()
        again = self.forward_backward()
        found = attribute(*gather_losses(float(ce), float(again)),
                          verdict.ranks or range(self.world_size))
        samples = [i for rank in found.spiking for i in self.loader.step_samples(position, rank)]
        windows = [self.loader.window(i) for i in samples]
        return self.response.settle_rerun(verdict, found, samples, windows), again

    def _drop_update(self, verdict: Verdict, position: int) -> None:
        """Carry out a verdict that drops this step's gradients: the one place where the step
        count goes back. `position`: the loader's before this step's data."""
        s = self.state
        self.dp.discard()
        outcome: dict = {}
        match verdict:
            case Discard(step_back=back, rewind_data=rewind):
                s.step -= back
                if rewind:  # the same data again
                    self.loader.position = position
            case Rollback():
                try:
                    outcome = self.checkpoints.rollback(s.step - 1, None, skip_data=True)
                except CommandRefused as e:  # nothing to go back to yet: the update is skipped
                    s.step -= 1
                    outcome = {"carried_out": "skip_update", "error": str(e)}
            case Stop(outcome=kind, decision=decision):
                s.step -= 1
                if kind == "restart":  # the ranks are healthy: after it, this step's data
                    self.loader.position = position
                self.stopped = Outcome(kind, s.step, reason=f"{decision.anomaly}: "
                                                            f"{decision.reason}")
                # a restart resumes at once on these hosts, from RAM (0 steps lost); a pause
                # may resume anywhere, later, so it goes to disk
                saved = self.checkpoints.save(to_disk=kind != "restart")
                outcome = {"checkpoint": str(saved)}
                self.checkpoints.persist()
        self.response.announce(verdict, **outcome)
        # after the step count is settled: the timer follows it
        self.telemetry.end_step(s.step, trace_next=self.response.found)

    def _measure(self, started: float, loss: torch.Tensor, grad_norm: float, lr: float,
                 shares: list[int]) -> StepMetrics:
        """Reduce the step across ranks, evaluate when due, publish, follow the ranks' speeds,
        checkpoint when due. `shares`: the ranks' samples this step."""
        t, s = self.spec.train, self.state
        commands = self.inbox.poll(s.step)
        loss, self.inbox.due, counts = self.telemetry.reduce_step(
            loss, commands, self.model.routing_counts())
        self.model.update_expert_bias(counts)
        worst = self.telemetry.reduce_worst(started)
        step_tokens = t.micro_batch * t.seq_len * t.grad_accum * self.world_size
        s.tokens += step_tokens
        metrics = StepMetrics(
            step=s.step, loss=loss, grad_norm=grad_norm, lr=lr,
            tokens_per_s=step_tokens / worst.step_time, step_time=worst.step_time,
            tokens=s.tokens, rss_bytes=worst.rss_bytes,
            source_tokens=dict(zip(self.loader.names, s.source_tokens, strict=True)),
            source_loss=self._source_loss(loss),
        )
        if t.eval_every and (s.step % t.eval_every == 0 or s.step == t.steps):
            metrics.eval_source_loss = self.evaluate_sources()
            metrics.eval_loss = sum(w * metrics.eval_source_loss[name] for name, w in
                                    zip(self.loader.names, self.loader.blend.weights, strict=True))
        ops, experts = self.telemetry.publish(metrics, worst, counts, self.response.found)
        self.response.observe(grad_norm, metrics.tokens_per_s, int(worst.local["rss_bytes"]),
                              ops, experts)
        if (change := s.rebalancer.observe(ops["ops"], shares)) is not None:
            self.response.rebalanced(s.step, change.shares, change.reason)
        self.checkpoints.save_if_due()
        return metrics

    def _source_loss(self, loss: float) -> dict[str, float]:
        """This step's mean training loss per source, over every rank's samples (one source:
        the step's loss, without a reduction)."""
        if len(self.loader.sources) == 1:
            return {self.loader.names[0]: loss}
        dist.all_reduce(self.source_sums)
        sums, counts = self.source_sums.tolist()
        return {name: total / n for name, total, n in
                zip(self.loader.names, sums, counts, strict=True) if n}

    @torch.no_grad()
    def evaluate_sources(self) -> dict[str, float]:
        """Each source's mean cross-entropy (nats per token) over the first `eval_batches`
        micro-batches of its held-out split, the same windows every time."""
        loaders = heldout_loaders(self.loader)
        totals = torch.zeros(len(loaders), device=self.device)
        with self.dp.full_parameters() as model:
            model.eval()
            for i, loader in enumerate(loaders):
                for _ in range(self.spec.train.eval_batches):
                    batch = loader.next_micro_batch()
                    totals[i] += model(batch.input_ids.to(self.device),
                                       batch.labels.to(self.device), doc_ids=batch.doc_ids).ce_loss
            model.train()
        dist.all_reduce(totals)
        totals /= self.spec.train.eval_batches * self.world_size
        return dict(zip(self.loader.names, totals.tolist(), strict=True))

    # -- the run --------------------------------------------------------------------------
    def fit(self) -> Outcome:
        self.emit(StateEvent(
            step=self.state.step, state="running", world_size=self.world_size,
            device=str(self.device), dtype=str(param_dtype(self.device)).removeprefix("torch."),
            strategy=self.strategy, params=sum(p.numel() for p in self.model.parameters()),
        ))
        self.watchdog.start()
        while self.state.step < self.spec.train.steps:
            metrics = self.train_step()
            if self.stopped is not None:  # the fault policy paused the job for a person
                self.finish()
                return self.stopped
            if metrics is None:
                continue
            self.telemetry.show(metrics)
            outcome = self.commands.handle(self.inbox.take())
            if outcome is not None:
                self.finish()
                return outcome
        self.checkpoints.save_final()
        self.finish(drop_memory_tier=True)
        return Outcome("completed", self.state.step)

    def finish(self, drop_memory_tier: bool = False) -> None:
        """Stop the watchdog and the metrics endpoint, wait for checkpoint writes."""
        self.watchdog.stop()
        self.telemetry.close()
        self.checkpoints.close(drop_memory_tier)
