"""Third-party models: diffusers UNets (optional extra) and released U-ViT checkpoints."""

from scalelong.adapters.diffusers import (
    DiffusersUNet2D,
    apply_scalelong,
    load_scalelong,
    remove_scalelong,
    save_scalelong,
)
from scalelong.adapters.uvit_checkpoint import load_uvit_checkpoint

__all__ = [
    "DiffusersUNet2D",
    "apply_scalelong",
    "load_scalelong",
    "load_uvit_checkpoint",
    "remove_scalelong",
    "save_scalelong",
]
