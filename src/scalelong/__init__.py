"""scalelong: ScaleLong (scaled long skip connections) for diffusion models.

Public API (the library: what your own training loop imports; torch and safetensors only)::

    SkipScaling, skip_coefficients     the method (scalelong.skips)
    describe                           each skip of a model: where it is scaled, its coefficient
    UViT, UNet                         backbones (scalelong.models)
    apply_scalelong, remove_scalelong  ScaleLong on third-party models (scalelong.adapters): diffusers
    is_applied, SkipInput              UNets and U-ViT, denoising-diffusion-pytorch's Unet, any network
    PretrainedWeightsWarning           whose skip inputs are declared with SkipInput (checked against
    find_skips                         the forward pass), or found by find_skips from one forward pass
    save_scalelong, load_scalelong     ScaleLong and its gates to / from a folder (scalelong.adapters.saving)
    Diagnostics, RunLog, robustness    stability diagnostics from any loop (scalelong.diagnostics)
    ScaleLongError                     the error for anything a user can fix

and of the application (the trainer's configuration)::

    load_config, Config                configuration (scalelong.training.config)

Every name is imported on first use, so ``import scalelong`` loads nothing (not even torch), and
the library's names never load the trainer, its config or YAML.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on first use
    from scalelong.adapters import (
        PretrainedWeightsWarning,
        SkipInput,
        apply_scalelong,
        find_skips,
        is_applied,
        remove_scalelong,
    )
    from scalelong.adapters.saving import load_scalelong, save_scalelong
    from scalelong.diagnostics import Diagnostics, robustness
    from scalelong.errors import ScaleLongError
    from scalelong.models import UNet, UViT
    from scalelong.runlog import RunLog
    from scalelong.skips import METHODS, SkipScaling, describe, skip_coefficients
    from scalelong.training.config import Config, load_config

# public name -> the module that defines it
_LAZY = {
    "METHODS": "scalelong.skips",
    "SkipScaling": "scalelong.skips",
    "describe": "scalelong.skips",
    "skip_coefficients": "scalelong.skips",
    "UNet": "scalelong.models",
    "UViT": "scalelong.models",
    "PretrainedWeightsWarning": "scalelong.adapters",
    "SkipInput": "scalelong.adapters",
    "apply_scalelong": "scalelong.adapters",
    "find_skips": "scalelong.adapters",
    "is_applied": "scalelong.adapters",
    "remove_scalelong": "scalelong.adapters",
    "save_scalelong": "scalelong.adapters.saving",
    "load_scalelong": "scalelong.adapters.saving",
    "Diagnostics": "scalelong.diagnostics",
    "robustness": "scalelong.diagnostics",
    "RunLog": "scalelong.runlog",
    "ScaleLongError": "scalelong.errors",
    "Config": "scalelong.training.config",
    "load_config": "scalelong.training.config",
}

__all__ = [
    "Config",
    "Diagnostics",
    "METHODS",
    "PretrainedWeightsWarning",
    "RunLog",
    "ScaleLongError",
    "SkipInput",
    "SkipScaling",
    "UNet",
    "UViT",
    "apply_scalelong",
    "describe",
    "find_skips",
    "is_applied",
    "load_config",
    "load_scalelong",
    "remove_scalelong",
    "robustness",
    "save_scalelong",
    "skip_coefficients",
]  # the keys of _LAZY (tests/product/test_imports.py checks)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scalelong' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


# ----------------------------------------------------------------------------- moved modules

# Modules of 0.1 that moved when the library and the application became folders, and a study's
# own modules when the study became a package: the old path imports the new module (the same
# object) and warns once. Removed in 0.3 (CHANGELOG.md).
MOVED = {
    "scalelong.declaration": "scalelong.adapters.declaration",
    "scalelong.tracing": "scalelong.adapters.tracing",
    "scalelong.checking": "scalelong.adapters.checking",
    "scalelong.saving": "scalelong.adapters.saving",
    "scalelong.overflow": "scalelong.diagnostics.overflow",
    "scalelong.theory": "scalelong.diagnostics.theory",
    "scalelong.metric_names": "scalelong.diagnostics.metric_names",
    "scalelong.metrics_log": "scalelong.runlog.records",
    "scalelong.tracking": "scalelong.runlog.tracking",
    "scalelong.lock": "scalelong.runlog.lock",
    "scalelong.provenance": "scalelong.runlog.provenance",
    "scalelong.fd_mnist": "scalelong.metrics.fd_mnist",
    "scalelong.frechet": "scalelong.metrics.frechet",
    "scalelong.t2i": "scalelong.training.t2i",
    "scalelong.train": "scalelong.training.train",
    "scalelong.build": "scalelong.training.build",
    "scalelong.config": "scalelong.training.config",
    "scalelong.presets": "scalelong.training.presets",
    "scalelong.checkpoint": "scalelong.training.checkpoint",
    "scalelong.evaluation": "scalelong.training.evaluation",
    "scalelong.launch": "scalelong.training.launch",
    "scalelong.runs": "scalelong.training.runs",
    "scalelong.export": "scalelong.training.export",
    "scalelong.user_model": "scalelong.training.user_model",
    "scalelong.plots": "scalelong.studies.plots",
    "scalelong.sweep": "scalelong.studies.sweep",
    "scalelong.compare": "scalelong.studies.compare",
    # the modules of one study alone, moved into its package
    "scalelong.studies.basin": "scalelong.studies.sweep.basin",
    "scalelong.studies.length": "scalelong.studies.sweep.length",
    "scalelong.studies.mapfile": "scalelong.studies.sweep.mapfile",
    "scalelong.studies.paired": "scalelong.studies.sweep.paired",
    "scalelong.studies.reading": "scalelong.studies.compare.reading",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a moved module under its old name: the new module itself, after one DeprecationWarning."""

    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path will be removed in scalelong 0.3",
            DeprecationWarning,
            stacklevel=2,  # the importing line (warnings skips importlib's own frames)
        )
        return importlib.import_module(new)

    def exec_module(self, module):  # the new module ran when it was imported
        pass


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())


# The one place the version is written: the build reads this line without importing the package
# (pyproject.toml), so it stays a plain string.
__version__ = "0.1.0"
