"""scalelong: ScaleLong (scaled long skip connections) for diffusion models.

Public API::

    SkipScaling, skip_coefficients     the method (scalelong.skips)
    UViT, UNet                         backbones (scalelong.models)
    apply_scalelong, remove_scalelong  diffusers UNets (scalelong.adapters, needs diffusers)
    load_config, Config                configuration (scalelong.config)
    ScaleLongError                     the error for anything a user can fix
"""

from scalelong.config import Config, load_config
from scalelong.errors import ScaleLongError
from scalelong.models import UNet, UViT
from scalelong.skips import METHODS, SkipScaling, skip_coefficients

__all__ = [
    "METHODS",
    "Config",
    "ScaleLongError",
    "SkipScaling",
    "UNet",
    "UViT",
    "apply_scalelong",
    "load_config",
    "remove_scalelong",
    "skip_coefficients",
]


def __getattr__(name: str):
    # The diffusers adapter imports diffusers only when it is asked for.
    if name in ("apply_scalelong", "remove_scalelong"):
        from scalelong import adapters

        return getattr(adapters, name)
    raise AttributeError(f"module 'scalelong' has no attribute {name!r}")


__version__ = "0.1.0"
