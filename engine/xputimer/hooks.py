"""Time a model's modules without touching the model: a forward pre-hook opens the op, the
forward hook closes it. Op names are the modules' qualified names ("layers.3.attention")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from engine.xputimer.timer import OpTimer

FlopCounter = Callable[[nn.Module, tuple], int]


def time_modules(model: nn.Module, timer: OpTimer, kinds: dict[type[nn.Module], str],
                 flops: FlopCounter | None = None) -> list[Any]:
    """Time every submodule that is an instance of a key of `kinds` (class -> op kind).
    `flops(module, args)` gives a matmul call's FLOPs from its inputs, so the op reports
    TFLOP/s. Returns the hook handles; `handle.remove()` on each stops the timing."""
    handles = []
    for name, module in model.named_modules():
        kind = next((k for cls, k in kinds.items() if isinstance(module, cls)), None)
        if kind is not None:
            counter = flops if kind == "matmul" else None
            handles += _time_module(module, name or type(module).__name__, kind, timer, counter)
    return handles


def _time_module(module: nn.Module, name: str, kind: str, timer: OpTimer,
                 flops: FlopCounter | None) -> list[Any]:
    spans: list = []  # a stack: a module may be re-entered (shared blocks, MTP)

    def pre(_module: nn.Module, args: tuple) -> None:
        span = timer.op(name, kind=kind, flops=flops(module, args) if flops else 0)
        span.__enter__()
        spans.append(span)

    def post(_module: nn.Module, _args: Any, _output: Any) -> None:
        spans.pop().__exit__(None, None, None)

    return [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
