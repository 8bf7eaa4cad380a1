"""Backbones. Each routes every long skip through :class:`scalelong.skips.SkipScaling`.

A backbone maps ``(x_t, t, condition)`` to a tensor of x_t's shape and knows nothing of noise
schedules; :func:`conditioning` says which keyword carries a batch's condition.
"""

import torch
from torch import nn

from scalelong.models.unet import UNet
from scalelong.models.uvit import UViT

__all__ = ["UNet", "UViT", "conditioning"]


def conditioning(model: nn.Module, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Keyword arguments that condition the model on a batch's labels (none if unconditional).

    ``labels`` are class indices (B,) for a class-conditional model and caption embeddings
    (B, 77, D) for a text-conditional one.
    """
    if getattr(model, "context_embed", None) is not None:
        return {"context": labels}
    return {"y": labels} if getattr(model, "num_classes", 0) > 0 else {}
