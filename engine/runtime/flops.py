"""Which of the model's modules are timed on every forward, and the FLOPs of a matmul call
(XPUTimer's op classes; the timed ops report TFLOP/s from these counts)."""

from __future__ import annotations

from torch import nn

from engine.moe.model import Attention, LMHead, RMSNorm, RoutedExperts, SwiGLU
from engine.moe.router import Router

TIMED_MODULES: dict[type[nn.Module], str] = {
    Attention: "matmul", Router: "compute", RoutedExperts: "matmul", SwiGLU: "matmul",
    RMSNorm: "compute", LMHead: "matmul",  # the head with its cross-entropy
}
MATMUL_MODULES = tuple(cls for cls, kind in TIMED_MODULES.items() if kind == "matmul")


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
