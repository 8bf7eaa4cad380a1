"""scalelong: ScaleLong (scaled long skip connections) for diffusion models.

Public API::

    SkipScaling, skip_coefficients     the method (scalelong.skips)
    UViT, UNet                         backbones (scalelong.models)
    apply_scalelong, remove_scalelong  ScaleLong on third-party models (scalelong.adapters): diffusers
    is_applied, SkipInput              UNets and U-ViT, denoising-diffusion-pytorch's Unet, any network
    PretrainedWeightsWarning           whose skip inputs are declared with SkipInput
    find_skips, skip_report            those skip inputs found from one forward pass, and their table
    Diagnostics, RunLog, robustness    stability diagnostics from any loop (scalelong.diagnostics)
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
    "Diagnostics",
    "PretrainedWeightsWarning",
    "RunLog",
    "ScaleLongError",
    "SkipInput",
    "SkipScaling",
    "UNet",
    "UViT",
    "apply_scalelong",
    "find_skips",
    "is_applied",
    "load_config",
    "remove_scalelong",
    "robustness",
    "skip_coefficients",
    "skip_report",
]


def __getattr__(name: str):
    # The diffusers adapter imports diffusers only when it is asked for.
    if name in (
        "apply_scalelong",
        "remove_scalelong",
        "is_applied",
        "SkipInput",
        "PretrainedWeightsWarning",
        "find_skips",
        "skip_report",
    ):
        from scalelong import adapters

        return getattr(adapters, name)
    if name in ("Diagnostics", "RunLog", "robustness"):  # they import the trainer's run directory
        from scalelong import diagnostics

        return getattr(diagnostics, name)
    raise AttributeError(f"module 'scalelong' has no attribute {name!r}")


# The one place the version is written: the build reads this line without importing the package
# (pyproject.toml), so it stays a plain string.
__version__ = "0.1.0"
