"""scalelong: ScaleLong (scaled long skip connections) for diffusion models.

Public API::

    SkipScaling, skip_coefficients     the method (scalelong.skips)
    UViT                               backbones (scalelong.models)
    load_config, Config                configuration (scalelong.config)
    ScaleLongError                     the error for anything a user can fix
"""

from scalelong.config import Config, load_config
from scalelong.errors import ScaleLongError
from scalelong.models import UViT
from scalelong.skips import METHODS, SkipScaling, skip_coefficients

__all__ = ["METHODS", "Config", "ScaleLongError", "SkipScaling", "UViT", "load_config", "skip_coefficients"]
__version__ = "0.1.0"
