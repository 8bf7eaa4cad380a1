"""ScaleLong on third-party models, without forking them; released U-ViT checkpoints.

:func:`apply_scalelong` installs one :class:`~scalelong.skips.SkipScaling` on a model and
scales its long skips where the decoder receives them, through forward pre-hooks. It picks the
adapter by the model's type from :data:`ADAPTERS`, one module per family:

* ``diffusers.py``: diffusers ``UNet2DModel`` / ``UNet2DConditionModel``;
* ``uvit_diffusers.py``: diffusers' U-ViT, ``UTransformer2DModel`` and ``UniDiffuserModel``;
* ``ddpm_pytorch.py``: ``denoising_diffusion_pytorch.Unet``;
* ``declared.py``: any other network, through ``skips=[SkipInput(...), ...]``;
* ``tracing.py``: those skips found by one forward pass (:func:`find_skips`), which
  ``apply_scalelong(model, method, example=(x, t))`` uses for a model no adapter knows.

Types are matched by package and class name along the MRO, so subclasses are served and no
optional package is imported to tell (the diffusers UNet adapter imports diffusers itself, with
an error naming the extra). The U-ViT and denoising-diffusion-pytorch modules only read a model
and describe where its skips enter as plain data; this package installs that description with
``declared.install``, so the per-family modules never import one another.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from scalelong.adapters import ddpm_pytorch, declared, uvit_diffusers
from scalelong.adapters import diffusers as diffusers_unets
from scalelong.adapters.declared import SkipInput
from scalelong.adapters.diffusers import DiffusersUNet2D, load_scalelong, save_scalelong
from scalelong.adapters.tracing import FoundSkips, TracedSkip, skip_report, trace_skips
from scalelong.adapters.uvit_checkpoint import load_uvit_checkpoint
from scalelong.errors import ScaleLongError
from scalelong.skips import DEFAULT_KAPPA, find_skip_scaling

__all__ = [
    "DiffusersUNet2D",
    "FoundSkips",
    "PretrainedWeightsWarning",
    "SkipInput",
    "TracedSkip",
    "apply_scalelong",
    "find_skips",
    "is_applied",
    "load_scalelong",
    "load_uvit_checkpoint",
    "remove_scalelong",
    "save_scalelong",
    "skip_report",
]


class PretrainedWeightsWarning(UserWarning):
    """ScaleLong was applied to a model with trained weights, whose function it changes at once."""


class Adapter(NamedTuple):
    """How ScaleLong is put on, taken off and detected on one family of models."""

    apply: Callable[[nn.Module, str, float | None, int], None]  # (model, method, kappa, reduction)
    remove: Callable[[nn.Module], Any]
    is_applied: Callable[[nn.Module], bool]


def _from_layout(layout: Callable[[nn.Module], dict[str, Any]]) -> Adapter:
    """An adapter that installs, through the declared-skips route, what ``layout(model)`` describes."""

    def apply(model: nn.Module, method: str, kappa: float | None, reduction: int) -> None:
        spec = layout(model)
        skips = [SkipInput(*s) for s in spec.pop("skips")]
        declared.install(model, method, kappa, skips, reduction=reduction, **spec)

    return Adapter(apply, declared.remove, declared.is_installed)


def _apply_unet(model: nn.Module, method: str, kappa: float | None, reduction: int) -> None:
    kappa = DEFAULT_KAPPA["unet"] if kappa is None else kappa
    diffusers_unets.apply_scalelong(model, method=method, kappa=kappa, reduction=reduction)


_UNETS = Adapter(_apply_unet, diffusers_unets.remove_scalelong, diffusers_unets.is_applied)

# (top-level package, class names, adapter): the models apply_scalelong knows by type.
ADAPTERS: tuple[tuple[str, tuple[str, ...], Adapter], ...] = (
    ("diffusers", ("UNet2DModel", "UNet2DConditionModel"), _UNETS),
    ("diffusers", ("UTransformer2DModel",), _from_layout(uvit_diffusers.utransformer_layout)),
    ("diffusers", ("UniDiffuserModel",), _from_layout(uvit_diffusers.unidiffuser_layout)),
    ("denoising_diffusion_pytorch", ("Unet",), _from_layout(ddpm_pytorch.unet_layout)),
    ("scalelong", ("DiffusersUNet2D",), _UNETS),  # the package's wrapper of a UNet2DModel
)
_BY_TYPE = {(package, name): adapter for package, names, adapter in ADAPTERS for name in names}


def _supported_text() -> str:
    """'diffusers UNet2DModel and UNet2DConditionModel, UTransformer2DModel, ...': the error's list."""
    parts, last = [], None
    for package, names, _ in ADAPTERS:
        if package != "scalelong":
            parts.append(("" if package == last else f"{package} ") + " and ".join(names))
            last = package
    return ", ".join(parts)


SUPPORTED = _supported_text()


def apply_scalelong(
    model: nn.Module,
    method: str = "cs",
    kappa: float | None = None,
    *,
    skips: Sequence[SkipInput] | None = None,
    num_tokens: int | None = None,
    skip_channels: Sequence[int] | None = None,
    reduction: int = 16,
    pretrained: bool | None = None,
    example: Sequence | Mapping | torch.Tensor | None = None,
) -> nn.Module:
    """Scale the long skips of ``model`` in place, without changing its code.

    Recognised types: diffusers ``UNet2DModel``, ``UNet2DConditionModel``, ``UTransformer2DModel``
    and ``UniDiffuserModel`` (U-ViT), ``denoising_diffusion_pytorch.Unet``, and their subclasses.
    For any other network, declare where its skips enter the decoder with ``skips``, outermost
    first::

        apply_scalelong(net, "cs", 0.7, skips=[SkipInput(net.dec[3], arg=0, channels=slice(-64, None)), ...])

    Args:
        model: the network.
        method: one of ``scalelong.skips.METHODS``.
        kappa: base of ``cs``: skip i (1 = outermost) gets ``kappa ** (i - 1)``. None: 0.5 on
            token skips (U-ViT, the paper's value), 0.9 on feature maps (the UNet default).
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
        example: for a model no adapter knows and no ``skips``: the inputs of one forward pass,
            ``(x, t)`` (or a dict of keyword inputs), on which :func:`find_skips` finds the skips.

    New LS parameters live in ``model.scalelong``; create the optimizer after this call.
    Returns ``model``.
    """
    if pretrained is not None and not isinstance(pretrained, bool):
        raise ScaleLongError(f"pretrained must be True, False or None (detect), got {pretrained!r}")
    if skips is not None:
        declared.install(
            model,
            method,
            kappa,
            skips,
            num_tokens=num_tokens,
            skip_channels=skip_channels,
            reduction=reduction,
        )
    elif num_tokens is not None or skip_channels is not None:
        raise ScaleLongError(
            "num_tokens and skip_channels size the gates of declared skips: pass them with skips=[...] "
            "(a supported model derives them)"
        )
    else:
        adapter = _adapter(model)
        if adapter is not None:
            adapter.apply(model, method, kappa, reduction)
        elif example is not None and find_skip_scaling(model) is None:
            _apply_found(model, method, kappa, example, reduction)
        else:
            raise _unsupported(model)
    _warn_if_pretrained(model, pretrained)
    return model


def remove_scalelong(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_scalelong`: remove its hooks and ``model.scalelong``. Returns ``model``."""
    adapter = _adapter(model)
    if declared.is_installed(model):
        declared.remove(model)
    elif adapter is not None and adapter.is_applied(model):
        adapter.remove(model)
    elif declared.is_hooked(model):
        raise ScaleLongError(
            "ScaleLong was applied to a model that holds this one; call remove_scalelong on that model"
        )
    else:
        raise ScaleLongError("ScaleLong is not applied to this model; nothing to remove")
    return model


def is_applied(model: nn.Module) -> bool:
    """Whether ScaleLong scales the skips of ``model`` (applied to it, or to a model that holds it)."""
    adapter = _adapter(model)
    return declared.is_hooked(model) or (adapter is not None and adapter.is_applied(model))


def find_skips(model: nn.Module, *example_inputs: object, **example_kwargs: object) -> FoundSkips:
    """The long skips of ``model``, outermost first, read off one forward pass on an example input.

    ``model(*example_inputs, **example_kwargs)`` runs once without gradients, in eval mode (the
    training flags and the random number generator are restored after). The first tensor input
    is the image x_t: skips are what depends on it. Pass the inputs the model is trained with, at
    a small batch: ``find_skips(net, torch.randn(1, 3, 32, 32), torch.full((1,), 0.5))``. How the
    skips are told apart from the main path and the conditioning: :mod:`scalelong.adapters.tracing`.

    Returns a :class:`~scalelong.adapters.tracing.FoundSkips`: a sequence of :class:`SkipInput`
    that ``apply_scalelong(model, method, skips=found, skip_channels=found.skip_channels)``
    installs (``apply_scalelong(model, method, example=(x, t))`` does both), with each skip's
    module path, producer and shape; ``print(found)`` shows the table of :func:`skip_report`.
    Raises one :class:`ScaleLongError` where it finds no skip, where the pairing is ambiguous (a
    skip that reaches two decoder modules, skips merged in two calls, skips not merged in reverse
    order, a merging module called twice), or where the forward pass fails.
    """
    if declared.is_hooked(model):
        raise ScaleLongError(
            f"find_skips: ScaleLong is applied to this {type(model).__name__}; find its skips before "
            "apply_scalelong (or call remove_scalelong first)"
        )
    return trace_skips(model, example_inputs, example_kwargs, SkipInput)


# ----------------------------------------------------------------------------- helpers


def _apply_found(
    model: nn.Module,
    method: str,
    kappa: float | None,
    example: Sequence | Mapping | torch.Tensor,
    reduction: int,
) -> None:
    """Install the skips :func:`find_skips` reads off one forward pass on ``example``."""
    if isinstance(example, torch.Tensor):
        found = find_skips(model, example)
    elif isinstance(example, Mapping):
        found = find_skips(model, **example)
    elif isinstance(example, Sequence) and not isinstance(example, str):
        found = find_skips(model, *example)
    else:
        raise ScaleLongError(
            "example must be the model's inputs, a tuple such as (x, t) or a dict, "
            f"got {type(example).__name__}"
        )
    declared.install(model, method, kappa, reduction=reduction, **found.install_kwargs())


def _adapter(model: nn.Module) -> Adapter | None:
    for cls in type(model).__mro__:
        adapter = _BY_TYPE.get((cls.__module__.partition(".")[0], cls.__name__))
        if adapter is not None:
            return adapter
    return None


def _unsupported(model: nn.Module) -> ScaleLongError:
    name = type(model).__name__
    if find_skip_scaling(model) is not None:
        return ScaleLongError(
            f"{name} already holds a SkipScaling (a scalelong backbone, or ScaleLong applied): "
            "choose its method in its config (model.skip.method) instead"
        )
    inner = next((path for path, m in model.named_modules() if path and _adapter(m) is not None), None)
    if inner is not None:  # e.g. denoising_diffusion_pytorch's GaussianDiffusion around its Unet
        held = type(model.get_submodule(inner)).__name__
        return ScaleLongError(
            f"apply_scalelong does not know {name}, but it holds a {held} at '{inner}': "
            f"apply it to that submodule (model.{inner}) before wrapping"
        )
    return ScaleLongError(
        f"apply_scalelong supports {SUPPORTED}; got {name}: declare its skip inputs instead, "
        "apply_scalelong(model, method, skips=[SkipInput(module, arg=...), ...]) (see scalelong.SkipInput), "
        "or let them be found from one forward pass: apply_scalelong(model, method, example=(x, t))"
    )


def _trained_from(model: nn.Module) -> str | None:
    """Where diffusers loaded ``model``'s weights from (``from_pretrained`` records it), or None."""
    if isinstance(model, DiffusersUNet2D):
        model = model.unet
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
