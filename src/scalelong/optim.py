"""The trainer's learning-rate schedule and EMA, for a loop of your own to borrow.

Cheap to import (torch and nothing of the trainer)::

    from scalelong.optim import ema_update, lr_factor

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, 500, 10_000, "cosine", 0.1))
    ...
    ema_update(ema, model, decay=0.9999)   # after each optimizer step
"""

from __future__ import annotations

import math

import torch
from torch import nn


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str, min_ratio: float) -> float:
    """lr multiplier after ``step`` updates: linear warm-up, then constant (the recipe of the U-ViT
    code base) or cosine decay to ``min_ratio`` at ``total_steps``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine":
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0


@torch.no_grad()
def ema_update(ema: nn.Module, model: nn.Module, decay: float) -> None:
    """``ema <- decay * ema + (1 - decay) * model`` for every parameter; buffers are copied.

    ``ema`` is a copy of ``model`` (``copy.deepcopy``, made after ScaleLong is on, so it holds its
    own gates); both list their parameters and buffers in the same order.
    """
    ema_p = list(ema.parameters())
    torch._foreach_lerp_(ema_p, [p.detach() for p in model.parameters()], 1.0 - decay)
    for b_ema, b in zip(ema.buffers(), model.buffers(), strict=True):
        b_ema.copy_(b)
