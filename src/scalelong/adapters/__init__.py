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
* any other network: the user's own ``skips=[SkipInput(...), ...]``, checked against the forward
  pass (:mod:`scalelong.adapters.checking`), or those :func:`find_skips` reads off one forward pass
  (:mod:`scalelong.adapters.tracing`), which ``apply_scalelong(model, method, example=(x, t))`` uses for a
  model no adapter knows.

Types are matched by package and class name along the MRO, so subclasses are served and no
optional package is imported to tell. The per-family modules never import one another, nor
anything of the trainer; they, the tracer and the check describe skips as the same plain data,
:class:`SkipInput` (:mod:`scalelong.adapters.declaration`). Saving, loading and listing what was
applied: :mod:`scalelong.adapters.saving` (``save_scalelong`` / ``load_scalelong``) and
:func:`scalelong.skips.describe`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from scalelong.adapters import checking, ddpm_pytorch, declared, tracing, uvit_diffusers
from scalelong.adapters import diffusers as diffusers_unets
from scalelong.adapters.declaration import SkipInput
from scalelong.adapters.tracing import FoundSkips, TracedSkip
from scalelong.adapters.uvit_checkpoint import load_uvit_checkpoint
from scalelong.errors import ScaleLongError
from scalelong.skips import METHODS, PAPER_METHODS, find_skip_scaling

__all__ = [
    "FoundSkips",
    "PretrainedWeightsWarning",
    "SkipInput",
    "TracedSkip",
    "apply_scalelong",
    "find_skips",
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
    example: object = None,
    check: bool = True,
) -> nn.Module:
    """Scale the long skips of ``model`` in place, without changing its code.

    Recognised types: diffusers ``UNet2DModel``, ``UNet2DConditionModel``, ``UTransformer2DModel``
    and ``UniDiffuserModel`` (U-ViT), ``denoising_diffusion_pytorch.Unet``, and their subclasses.
    For any other network, let :func:`find_skips` read its skips off one forward pass on an
    example input, or declare where they enter the decoder with ``skips``, outermost first::

        apply_scalelong(net, "cs", 0.7, example=(x, t))
        apply_scalelong(net, "cs", 0.7, skips=[SkipInput("dec.3", arg=0, channels=slice(-64, None)), ...])

    Args:
        model: the network.
        method: one of the paper's methods, ``scalelong.skips.PAPER_METHODS``; there is no default,
            since applying ScaleLong is choosing one (``none`` changes nothing, bit for bit). The
            others (``skip-norm``, ``merge-norm``, ``cs-init``) are built into the package's own
            backbones only and are refused here.
        kappa: base of ``cs``: skip i (1 = outermost) gets ``kappa ** (i - 1)``. None: the default
            of ``scalelong.skips.DEFAULT_KAPPA``, 0.5 on token skips (U-ViT, the paper's value),
            0.9 on feature maps (the UNet default).
        skips: the declared skip inputs (see :class:`SkipInput`), or what :func:`find_skips`
            returned; used instead of the built-in layout when given for a supported type.
        num_tokens: with ``skips``: token count L of (B, L, D) skips, for the LS gates (taken
            from ``find_skips``'s result when it is given).
        skip_channels: with ``skips``: channels of each (B, C, H, W) skip, for the LS gates.
        reduction: squeeze-excitation reduction of the LS gates.
        pretrained: whether ``model`` carries trained weights; None detects it for diffusers
            models (``from_pretrained`` records ``_name_or_path`` in their config). A method
            whose coefficients are not all 1 then warns (:class:`PretrainedWeightsWarning`):
            ScaleLong changes the network's function from the first step and is a from-scratch
            method. ``False`` silences the warning (also right for ``from_config`` of a loaded
            model's config, which copies ``_name_or_path`` onto fresh weights).
        example: the inputs of one forward pass, ``(x, t)`` (a tuple of positional inputs, a dict
            of keyword inputs, or one tensor), as the model is trained with, at a small batch.
            For a type no adapter knows and no ``skips``: :func:`find_skips` reads the skips off
            it. With ``skips``: the declaration is checked on it at once.
        check: check a declaration of ``skips`` against the forward pass
            (:mod:`scalelong.adapters.checking`): the order (outermost first), every skip once,
            each channel slice exactly the skip's; on ``example`` when given, else on the
            model's first call, before it runs. Each mistake is one :class:`ScaleLongError`.
            ``False`` trusts the declaration (a subset of the skips on purpose, say).

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
    by_hand = skips is not None and not isinstance(skips, FoundSkips)
    inputs = None if example is None else _example(example)
    if isinstance(skips, FoundSkips):  # as found: its gate sizes, shapes and blocks come with it
        spec: dict[str, Any] = skips.install_kwargs()
        if num_tokens is not None or skip_channels is not None:
            spec.update(num_tokens=num_tokens, skip_channels=skip_channels)
    elif skips is not None:
        spec = {"skips": skips, "num_tokens": num_tokens, "skip_channels": skip_channels}
    elif num_tokens is not None or skip_channels is not None:
        raise ScaleLongError(
            "num_tokens and skip_channels size the gates of declared skips: pass them with skips=[...] "
            "(a supported model derives them)"
        )
    else:
        layout = _layout(model)
        if layout is None and (inputs is None or find_skip_scaling(model) is not None):
            raise _unsupported(model)
        _check_free(model)
        spec = (
            layout(model)
            if layout is not None
            else find_skips(model, *inputs[0], **inputs[1]).install_kwargs()
        )
    declared.install(model, method, kappa, spec.pop("skips"), reduction=reduction, **spec)
    if by_hand and check:
        if inputs is None:
            checking.check_at_first_call(model, declared.installed(model).skips)
        else:
            try:
                checking.check(model, declared.installed(model).skips, *inputs)
            except ScaleLongError:
                declared.remove(model)  # nothing changed
                raise
    _warn_if_pretrained(model, pretrained)
    return model


def remove_scalelong(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_scalelong`: remove its hooks and ``model.scalelong``. Returns ``model``."""
    if declared.installed(model) is not None:
        checking.cancel(model)
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


def find_skips(model: nn.Module, *example_inputs: object, **example_kwargs: object) -> FoundSkips:
    """The long skips of ``model``, outermost first, read off one forward pass on an example input.

    ``model(*example_inputs, **example_kwargs)`` runs once without gradients, in eval mode (the
    training flags and the random number generator are restored after). The first tensor input
    is the image x_t: skips are what depends on it. Pass the inputs the model is trained with, at
    a small batch: ``find_skips(net, torch.randn(1, 3, 32, 32), torch.full((1,), 0.5))``. How the
    skips are told apart from the main path and the conditioning: :mod:`scalelong.adapters.tracing`.

    Returns a :class:`~scalelong.adapters.tracing.FoundSkips`: the declaration as data, a sequence
    of :class:`SkipInput` with dotted module paths (a skip handed over in a tuple, such as a
    diffusers up block's ``res_hidden_states_tuple``, by ``item=``), that
    ``apply_scalelong(model, method, skips=found)`` installs (``apply_scalelong(model, method,
    example=(x, t))`` does both). ``scalelong.describe(found)`` and ``print(found)`` list each skip:
    the module and input it enters, the channel slice, its shape and where the encoder makes it.
    Raises one :class:`ScaleLongError` where it finds no skip, where the pairing is ambiguous (a
    skip that reaches two decoder modules, skips merged in two calls, skips not merged in reverse
    order, a merging module called twice), or where the forward pass fails.
    """
    if declared.is_hooked(model):
        raise ScaleLongError(
            f"find_skips: ScaleLong is applied to this {type(model).__name__}; find its skips before "
            "apply_scalelong (or call remove_scalelong first)"
        )
    return tracing.find(model, example_inputs, example_kwargs)


# ----------------------------------------------------------------------------- helpers


def _layout(model: nn.Module) -> Layout | None:
    for cls in type(model).__mro__:
        layout = _BY_TYPE.get((cls.__module__.partition(".")[0], cls.__name__))
        if layout is not None:
            return layout
    return None


def _example(example: object) -> tuple[tuple, dict]:
    """(args, kwargs) of an ``example=``: one tensor, a tuple (or list) of inputs, or a dict."""
    if isinstance(example, torch.Tensor):
        return (example,), {}
    if isinstance(example, Mapping):
        return (), dict(example)
    if isinstance(example, (tuple, list)):
        return tuple(example), {}
    raise ScaleLongError(
        f"example must be the model's inputs, a tuple such as (x, t), a dict or one tensor, got "
        f"{type(example).__name__}"
    )


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
        f"apply_scalelong supports {SUPPORTED}; got {name}: let its skips be found from one forward pass, "
        "apply_scalelong(model, method, example=(x, t)), or declare them, "
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
