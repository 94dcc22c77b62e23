"""The learning-rate schedule."""

from __future__ import annotations

import math

from engine.runtime.spec import TrainSpec


def lr_at(step: int, train: TrainSpec) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to `min_lr_ratio`·lr at
    `decay_end` (default `steps`), flat after it (1-based)."""
    if step <= train.warmup:
        return train.lr * step / max(1, train.warmup)
    decay_end = train.decay_end or train.steps
    progress = min(1.0, (step - train.warmup) / max(1, decay_end - train.warmup))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return train.lr * (train.min_lr_ratio + (1.0 - train.min_lr_ratio) * cosine)
