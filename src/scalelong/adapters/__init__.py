"""ScaleLong on third-party models, without forking them; released U-ViT checkpoints.

:func:`apply_scalelong` installs one :class:`~scalelong.skips.SkipScaling` on a model and
scales its long skips where the decoder receives them, through forward pre-hooks. There is one
installer (``declared.py``, skips declared as :class:`SkipInput`); each supported family has a
module that reads a model and describes, as plain data, where its skips enter its decoder, and
:data:`ADAPTERS` picks that module by the model's type:

* ``diffusers.py``: diffusers ``UNet2DModel`` / ``UNet2DConditionModel`` (each skip an element
  of an up block's ``res_hidden_states_tuple``);
* ``uvit_diffusers.py``: diffusers' U-ViT, ``UTransformer2DModel`` and ``UniDiffuserModel``;
* ``ddpm_pytorch.py``: ``denoising_diffusion_pytorch.Unet``;
* any other network: the user's own ``skips=[SkipInput(...), ...]``.

Types are matched by package and class name along the MRO, so subclasses are served and no
optional package is imported to tell. The per-family modules never import one another, nor
anything of the trainer. Saving, loading and listing what was applied: :mod:`scalelong.saving`
(``save_scalelong`` / ``load_scalelong``) and :func:`scalelong.skips.describe`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from scalelong.adapters import ddpm_pytorch, declared, uvit_diffusers
from scalelong.adapters import diffusers as diffusers_unets
from scalelong.adapters.declared import SkipInput
from scalelong.adapters.uvit_checkpoint import load_uvit_checkpoint
from scalelong.errors import ScaleLongError
from scalelong.skips import METHODS, PAPER_METHODS, find_skip_scaling

__all__ = [
    "PretrainedWeightsWarning",
    "SkipInput",
    "apply_scalelong",
    "is_applied",
    "load_uvit_checkpoint",
    "remove_scalelong",
]


class PretrainedWeightsWarning(UserWarning):
    """ScaleLong was applied to a model with trained weights, whose function it changes at once."""


Layout = Callable[[nn.Module], dict[str, Any]]  # model -> {"skips": [...], and install's keywords}

# (top-level package, class names, layout): the models apply_scalelong knows by type.
ADAPTERS: tuple[tuple[str, tuple[str, ...], Layout], ...] = (
    ("diffusers", ("UNet2DModel", "UNet2DConditionModel"), diffusers_unets.unet_layout),
    ("diffusers", ("UTransformer2DModel",), uvit_diffusers.utransformer_layout),
    ("diffusers", ("UniDiffuserModel",), uvit_diffusers.unidiffuser_layout),
    ("denoising_diffusion_pytorch", ("Unet",), ddpm_pytorch.unet_layout),
)
_BY_TYPE = {(package, name): layout for package, names, layout in ADAPTERS for name in names}


def _supported_text() -> str:
    """'diffusers UNet2DModel and UNet2DConditionModel, UTransformer2DModel, ...': the error's list."""
    parts, last = [], None
    for package, names, _ in ADAPTERS:
        parts.append(("" if package == last else f"{package} ") + " and ".join(names))
        last = package
    return ", ".join(parts)


SUPPORTED = _supported_text()


def apply_scalelong(
    model: nn.Module,
    method: str,
    kappa: float | None = None,
    *,
    skips: Sequence[SkipInput] | None = None,
    num_tokens: int | None = None,
    skip_channels: Sequence[int] | None = None,
    reduction: int = 16,
    pretrained: bool | None = None,
) -> nn.Module:
    """Scale the long skips of ``model`` in place, without changing its code.

    Recognised types: diffusers ``UNet2DModel``, ``UNet2DConditionModel``, ``UTransformer2DModel``
    and ``UniDiffuserModel`` (U-ViT), ``denoising_diffusion_pytorch.Unet``, and their subclasses.
    For any other network, declare where its skips enter the decoder with ``skips``, outermost
    first::

        apply_scalelong(net, "cs", 0.7, skips=[SkipInput(net.dec[3], arg=0, channels=slice(-64, None)), ...])

    Args:
        model: the network.
        method: one of the paper's methods, ``scalelong.skips.PAPER_METHODS``; there is no default,
            since applying ScaleLong is choosing one (``none`` changes nothing, bit for bit). The
            others (``skip-norm``, ``merge-norm``, ``cs-init``) are built into the package's own
            backbones only and are refused here.
        kappa: base of ``cs``: skip i (1 = outermost) gets ``kappa ** (i - 1)``. None: the default
            of ``scalelong.skips.DEFAULT_KAPPA``, 0.5 on token skips (U-ViT, the paper's value),
            0.9 on feature maps (the UNet default).
        skips: the declared skip inputs (see :class:`SkipInput`); required for an unsupported
            type, and used instead of the built-in layout when given for a supported one.
        num_tokens: with ``skips``: token count L of (B, L, D) skips, for the LS gates.
        skip_channels: with ``skips``: channels of each (B, C, H, W) skip, for the LS gates.
        reduction: squeeze-excitation reduction of the LS gates.
        pretrained: whether ``model`` carries trained weights; None detects it for diffusers
            models (``from_pretrained`` records ``_name_or_path`` in their config). A method
            whose coefficients are not all 1 then warns (:class:`PretrainedWeightsWarning`):
            ScaleLong changes the network's function from the first step and is a from-scratch
            method. ``False`` silences the warning (also right for ``from_config`` of a loaded
            model's config, which copies ``_name_or_path`` onto fresh weights).

    New LS parameters live in ``model.scalelong``; create the optimizer after this call.
    :func:`scalelong.skips.describe` lists what was applied. Returns ``model``.
    """
    if pretrained is not None and not isinstance(pretrained, bool):
        raise ScaleLongError(f"pretrained must be True, False or None (detect), got {pretrained!r}")
    if method in METHODS and method not in PAPER_METHODS:
        raise ScaleLongError(
            f"apply_scalelong supports the methods {', '.join(PAPER_METHODS)}; {method!r} is built into the "
            "package's own UViT and UNet only (their skip_method, or model.skip.method in a config)"
        )
    if skips is not None:
        spec: dict[str, Any] = {"skips": skips, "num_tokens": num_tokens, "skip_channels": skip_channels}
    elif num_tokens is not None or skip_channels is not None:
        raise ScaleLongError(
            "num_tokens and skip_channels size the gates of declared skips: pass them with skips=[...] "
            "(a supported model derives them)"
        )
    else:
        layout = _layout(model)
        if layout is None:
            raise _unsupported(model)
        _check_free(model)
        spec = layout(model)
    declared.install(model, method, kappa, spec.pop("skips"), reduction=reduction, **spec)
    _warn_if_pretrained(model, pretrained)
    return model


def remove_scalelong(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_scalelong`: remove its hooks and ``model.scalelong``. Returns ``model``."""
    if declared.installed(model) is not None:
        declared.remove(model)
        return model
    inner = [path for path, _ in declared.installed_below(model) if path]
    if inner:
        raise ScaleLongError(
            f"ScaleLong was applied to the submodule {inner[0]!r} of this model; "
            f"call remove_scalelong on that one (model.{inner[0]})"
        )
    if declared.is_hooked(model):
        raise ScaleLongError(
            "ScaleLong was applied to a model that holds this one; call remove_scalelong on that model"
        )
    raise ScaleLongError("ScaleLong is not applied to this model; nothing to remove")


def is_applied(model: nn.Module) -> bool:
    """Whether ScaleLong hooks scale the skips of ``model`` (applied to it, to a model that holds
    it, or to one of its submodules)."""
    return declared.is_hooked(model)


# ----------------------------------------------------------------------------- helpers


def _layout(model: nn.Module) -> Layout | None:
    for cls in type(model).__mro__:
        layout = _BY_TYPE.get((cls.__module__.partition(".")[0], cls.__name__))
        if layout is not None:
            return layout
    return None


def _check_free(model: nn.Module) -> None:
    """Refuse a second application before reading the layout (which may not fit a hooked model)."""
    if declared.installed(model) is not None or declared.is_hooked(model):
        raise ScaleLongError(
            "ScaleLong is already applied to this model (or to a model that holds it); "
            "call remove_scalelong on that model first"
        )


def _unsupported(model: nn.Module) -> ScaleLongError:
    name = type(model).__name__
    if find_skip_scaling(model) is not None:
        return ScaleLongError(
            f"{name} already holds a SkipScaling (a scalelong backbone, or ScaleLong applied): "
            "choose the method when you build it (skip_method=...) instead"
        )
    inner = next((path for path, m in model.named_modules() if path and _layout(m) is not None), None)
    if inner is not None:  # e.g. denoising_diffusion_pytorch's GaussianDiffusion around its Unet
        held = type(model.get_submodule(inner)).__name__
        return ScaleLongError(
            f"apply_scalelong does not know {name}, but it holds a {held} at '{inner}': "
            f"apply it to that submodule (model.{inner}) before wrapping"
        )
    return ScaleLongError(
        f"apply_scalelong supports {SUPPORTED}; got {name}: declare its skip inputs instead, "
        "apply_scalelong(model, method, skips=[SkipInput(module, arg=...), ...]) (see scalelong.SkipInput)"
    )


def _trained_from(model: nn.Module) -> str | None:
    """Where diffusers loaded ``model``'s weights from (``from_pretrained`` records it), or None."""
    config = getattr(model, "config", None)
    source = config.get("_name_or_path") if isinstance(config, Mapping) else None
    return str(source) if source else None


def _warn_if_pretrained(model: nn.Module, pretrained: bool | None) -> None:
    scaling = find_skip_scaling(model)
    if pretrained is False or scaling is None or all(c == 1.0 for c in scaling.coefficients()):
        return  # silenced, or none / cs with kappa 1: the function is unchanged (learned: None)
    source = _trained_from(model)
    if pretrained is None and source is None:
        return
    loaded = f" (loaded from {source!r})" if source else ""
    warnings.warn(
        f"apply_scalelong: {type(model).__name__} carries trained weights{loaded}, and method "
        f"{scaling.method!r} rescales its skips, so the network's function changes from the first step; "
        "ScaleLong is a from-scratch method (the paper trains from scratch). "
        "Pass pretrained=False if the weights are fresh or were trained with this method.",
        PretrainedWeightsWarning,
        stacklevel=3,
    )
