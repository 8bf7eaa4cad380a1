"""Backbones. Each routes every long skip through :class:`scalelong.skips.SkipScaling`."""

from scalelong.models.unet import UNet
from scalelong.models.uvit import UViT

__all__ = ["UNet", "UViT"]
