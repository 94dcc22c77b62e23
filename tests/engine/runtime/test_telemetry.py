"""Telemetry on one process: module timing switches on and off, sampled steps leave a trace,
and a step is published as its `step`, `experts` and `ops` events."""

import torch
from torch import nn

from engine.contract import ExpertsEvent, LogEvent, OpsEvent, StepEvent
from engine.moe.model import RMSNorm
from engine.runtime.telemetry import ProgressBar, StepMetrics, Telemetry, Worst
from engine.xputimer import OpTimer


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(4, 1e-6)

    def forward(self, x):
        return self.norm(x)

    def expert_stats(self, counts):
        return [{"tokens": counts.tolist()}]


def telemetry(tmp_path, sample_every: int = 0) -> tuple[Telemetry, Model, list]:
    model, events = Model(), []
    timer = OpTimer(sample_every=sample_every)
    return (Telemetry(model, dp=None, timer=timer, top_k=1, world_size=1,
                      device=torch.device("cpu"), run_dir=tmp_path, emit=events.append),
            model, events)


def test_module_timing_is_on_by_default_and_can_be_switched_off(tmp_path):
    t, model, _ = telemetry(tmp_path)
    model(torch.ones(2, 4))
    assert t.end_step(1).ops["norm"].count == 1
    t.set_timing(False)
    model(torch.ones(2, 4))
    assert "norm" not in t.end_step(2).ops
    t.set_timing(True)
    model(torch.ones(2, 4))
    assert t.end_step(3).ops["norm"].count == 1
    assert t.last_timings.step == 3


def test_a_sampled_step_leaves_a_trace_and_an_anomaly_samples_the_next(tmp_path):
    t, model, events = telemetry(tmp_path)
    model(torch.ones(2, 4))
    assert not t.end_step(1, trace_next=True).sampled
    model(torch.ones(2, 4))
    assert t.end_step(2).sampled
    (log,) = events
    assert isinstance(log, LogEvent) and log.step == 2
    assert log.details["trace"] == str(tmp_path / "traces" / "step-000002.json")
    assert (tmp_path / "traces" / "step-000002.json").exists()


def test_publish_emits_the_step_its_experts_and_its_ops(tmp_path):
    t, model, events = telemetry(tmp_path)
    model(torch.ones(2, 4))
    metrics = StepMetrics(step=1, loss=3.0, grad_norm=0.5, lr=1e-3, tokens_per_s=100.0,
                          step_time=0.2, tokens=20, rss_bytes=1 << 20, eval_loss=2.5)
    worst = Worst(0.2, 1 << 20, {"params": 64}, {"bytes": 8}, t.system.sample())
    ops, experts = t.publish(metrics, worst, torch.tensor([3.0, 1.0]), trace_next=False)

    step, expert, op = events
    assert step == StepEvent(
        step=1, loss=3.0, grad_norm=0.5, lr=1e-3, tokens_per_s=100.0, step_time=0.2,
        tokens=20, memory={"rss_bytes": 1 << 20}, eval_loss=2.5, state_bytes={"params": 64},
        comm={"bytes": 8}, system=step.system)
    assert set(step.system) >= {"cpu_percent", "rss_bytes"}  # field -> the value of each rank
    assert expert == ExpertsEvent(step=1, layers=[{"tokens": [3.0, 1.0]}]) and experts == \
        expert.layers
    assert isinstance(op, OpsEvent) and op.ops["norm"]["count"] == 1 and op.ranks == ops["ranks"]
    assert "system" not in ops  # it went into the step event


def test_the_progress_bar_draws_every_twentieth_of_the_run_off_a_terminal(capsys):
    bar = ProgressBar(total=40)
    for step in range(1, 5):
        bar.update(StepMetrics(step=step, loss=2.0, grad_norm=1.0, lr=1e-3, tokens_per_s=1e3,
                               step_time=0.1, tokens=step, rss_bytes=0))
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("step ")[1].split()[0] for line in lines] == ["2/40", "4/40"]
