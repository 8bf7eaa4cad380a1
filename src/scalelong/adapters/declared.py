"""The one installer: ScaleLong on any network whose long skips are declared as inputs.

A long skip reaches the decoder as an input of some submodule: a merge layer called as
``merge(x, skip)`` (U-ViT), a decoder block called as ``block(x, skip=skip)``, a block that
receives ``torch.cat([x, skip], dim=1)`` made in its parent's forward (EDM's SongUNet,
denoising-diffusion-pytorch), or one element of a tuple of skips handed to a decoder block
(diffusers' up blocks take ``res_hidden_states_tuple``). A :class:`SkipInput` names that submodule
(the module, or its dotted path in the model), the input, for a tuple the element, and for a
concatenated input the skip's channel slice::

    skips = [
        SkipInput("dec.3", arg=0, channels=slice(-64, None)),            # skip 1: cat([x, s1]), s1 64 wide
        SkipInput(net.dec[2], arg="skip"),                               # skip 2: dec[2](x, skip=s2)
        SkipInput("up_blocks.0", arg="res_hidden_states_tuple", item=1),  # element 1 of a tuple
    ]
    apply_scalelong(net, "ls", skips=skips, skip_channels=[64, 128, 128])

:class:`SkipInput` itself, plain data, lives in :mod:`scalelong.adapters.declaration` (the tracer of
:func:`scalelong.find_skips` emits it too). Every adapter of :mod:`scalelong.adapters` describes
its family's layout in these terms and
installs it here, so there is one installer. A declaration is plain data once its modules are
paths (:meth:`SkipInput.to_dict`): :func:`scalelong.adapters.save_scalelong` writes it beside the
gates and :func:`scalelong.adapters.load_scalelong` replays it.

:func:`install` registers one :class:`SkipScaling` as ``model.scalelong`` and, through torch's
public ``register_forward_pre_hook(..., with_kwargs=True)``, one pre-hook on each named submodule
that replaces the skip (or its slice, or its tuple element) with ``scaling(skip, index)`` before
the submodule runs; the handles are kept for :func:`remove`. Skip ``i`` is the ``i``-th entry of
the list: list them outermost first (the skip made next to the input, merged next to the output).

Each hook is a plain function that finds its :class:`SkipScaling` through an unregistered
reference in its submodule's ``__dict__``, never through a closure, so ``copy.deepcopy`` (an EMA
copy) gets hooks, and hook handles, that use the copy's parameters, and ``.to()``, ``state_dict``
and optimizers see the LS parameters once, under ``scalelong.*``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from torch import nn

from scalelong.adapters.declaration import SkipInput, input_text, locate
from scalelong.errors import ScaleLongError
from scalelong.skips import DEFAULT_KAPPA, SkipScaling, SkipSite, find_skip_scaling

# Keys in a hooked submodule's __dict__ (its SkipScaling, its hook's handle, its resolved inputs),
# and in the model's __dict__ the declaration that was installed, which marks where ScaleLong is.
_REF, _HOOK, _SPECS, _INSTALLED = (
    "_scalelong_scaling",
    "_scalelong_hook",
    "_scalelong_skip_inputs",
    "_scalelong_installed",
)


class Installed(NamedTuple):
    """What :func:`install` put on a model, as plain data: replayed by ``load_scalelong``."""

    skips: tuple[SkipInput, ...]  # outermost first, modules as paths in the model
    num_tokens: int | None
    skip_channels: tuple[int, ...] | None
    shapes: tuple[tuple[int | None, ...] | None, ...]  # each skip's shape without the batch, where known


class _Spec(NamedTuple):
    """A resolved :class:`SkipInput`, kept on its submodule (plain data, so deepcopy is trivial)."""

    index: int  # 1 = outermost
    position: int | None  # where it sits in ``args``, None if it can only be a keyword
    name: str | None  # its keyword, None if it is positional-only or unnamed
    channels: slice | None
    dim: int
    item: int | None


def install(
    model: nn.Module,
    method: str,
    kappa: float | None,
    skips: Sequence[SkipInput],
    *,
    num_tokens: int | None = None,
    skip_channels: Sequence[int] | None = None,
    reduction: int = 16,
    blocks: Mapping[str, nn.Module | str] | None = None,
    shapes: Sequence[tuple[int | None, ...]] | None = None,
) -> SkipScaling:
    """Scale the declared skip inputs of ``model`` in place; return the installed :class:`SkipScaling`.

    ``num_tokens`` (token skips, all of L tokens) or ``skip_channels`` (one width per skip,
    outermost first) size the LS gates; constant methods need neither. ``kappa=None`` takes the
    U-ViT default when ``num_tokens`` is given and the UNet default otherwise. ``blocks`` are the
    model's blocks, in forward order, whose features :class:`~scalelong.diagnostics.Diagnostics`
    records: submodules of ``model`` or their dotted paths in it (what :func:`scalelong.find_skips`
    gives, so a declaration found on one model fits every copy); ``shapes`` each skip's shape
    without the batch (None for an unknown side), for :func:`scalelong.skips.describe`. Raises
    :class:`ScaleLongError` before changing anything if the declaration is wrong, and takes back
    what it had put on the model if anything fails after.
    """
    skips = [s if isinstance(s, SkipInput) else SkipInput(*s) for s in skips]
    if not skips:
        raise ScaleLongError(
            "skips= declares no skip input; list one SkipInput per long skip, outermost first"
        )
    _check_own_modules(model, skips)
    _check_not_applied(model, skips)
    resolved, grouped = _resolve(model, skips)
    if num_tokens is not None and skip_channels is not None:
        raise ScaleLongError("give num_tokens (token skips) or skip_channels (feature maps), not both")
    if skip_channels is not None and len(skip_channels) != len(skips):
        raise ScaleLongError(
            f"skip_channels lists {len(skip_channels)} widths for {len(skips)} skips; give one per skip"
        )
    if shapes is None:  # what the gates' sizes say: (C, ?, ?) maps or (L, ?) tokens
        if skip_channels is not None:
            shapes = [(int(c), None, None) for c in skip_channels]
        else:
            shapes = [None if num_tokens is None else (num_tokens, None)] * len(skips)
    shapes = _check_shapes(shapes, len(skips))
    watched = _blocks(model, blocks or {})
    if kappa is None:
        kappa = DEFAULT_KAPPA["uvit" if num_tokens is not None else "unet"]
    scaling = SkipScaling(
        method, len(skips), kappa, num_tokens=num_tokens, reduction=reduction, skip_channels=skip_channels
    )
    sites = [
        SkipSite(s.module, input_text(spec.position, spec.name, spec.item), s.channels, shape)
        for s, spec, shape in zip(*resolved, shapes, strict=True)
    ]
    scaling.declare_sites(sites)
    record = Installed(
        tuple(resolved[0]),
        num_tokens,
        None if skip_channels is None else tuple(int(c) for c in skip_channels),
        shapes,
    )
    param = next(model.parameters(), None)
    if param is not None:
        scaling.to(device=param.device, dtype=param.dtype)
    # everything is checked: only now does the model change, and a failure takes all of it back
    try:
        model.scalelong = scaling
        for module, module_specs in grouped:
            module.__dict__[_REF] = scaling  # not a submodule: the parameters belong to model.scalelong
            module.__dict__[_SPECS] = module_specs
            module.__dict__[_HOOK] = module.register_forward_pre_hook(_scale_inputs_hook, with_kwargs=True)
        model.__dict__[_INSTALLED] = record
        if watched:
            scaling.watch_blocks(watched)
    except BaseException:
        _undo(model, [module for module, _ in grouped], scaling)
        raise
    return scaling


def _undo(model: nn.Module, modules: Sequence[nn.Module], scaling: SkipScaling) -> None:
    """Take back what :func:`install` had put on the model before it failed, whatever it had reached."""
    for module in modules:
        handle = module.__dict__.pop(_HOOK, None)
        if handle is not None:
            handle.remove()
        module.__dict__.pop(_REF, None)
        module.__dict__.pop(_SPECS, None)
    model.__dict__.pop(_INSTALLED, None)
    scaling.watch_blocks({})
    if model._modules.get("scalelong") is scaling:
        del model._modules["scalelong"]


def remove(model: nn.Module) -> None:
    """Undo :func:`install`: remove the hooks (through their handles) and ``model.scalelong``."""
    installed: Installed = model.__dict__.pop(_INSTALLED)
    for path in dict.fromkeys(s.module for s in installed.skips):
        module = model.get_submodule(path)
        module.__dict__.pop(_HOOK).remove()
        del module.__dict__[_REF], module.__dict__[_SPECS]
    model.scalelong.watch_blocks({})  # a kept reference to the removed module holds no blocks
    del model.scalelong


def installed(model: nn.Module) -> Installed | None:
    """The declaration :func:`install` put on this very model (not on one that holds it), or None."""
    return model.__dict__.get(_INSTALLED)


def installed_below(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, submodule) of every module inside ``model`` (itself included, path '') that
    :func:`install` put ScaleLong on."""
    return [(path, m) for path, m in model.named_modules() if _INSTALLED in m.__dict__]


def is_hooked(model: nn.Module) -> bool:
    """Whether any submodule of ``model`` carries a ScaleLong skip hook."""
    return any(_HOOK in m.__dict__ for m in model.modules())


# ----------------------------------------------------------------------------- checking a declaration


def _check_own_modules(model: nn.Module, skips: Sequence[SkipInput]) -> None:
    """A SkipInput whose module is not in ``model``: most often a declaration made for another model
    (built earlier, or the model before a copy), which would hook that model instead."""
    own = {id(m) for m in model.modules()}
    for index, skip in enumerate(skips, start=1):
        module = skip.module
        if isinstance(module, str) or id(module) in own:
            continue
        if not isinstance(module, nn.Module):
            raise ScaleLongError(
                f"skip {index}: SkipInput.module must be a submodule of the model or its path; "
                f"got a {type(module).__name__}"
            )
        what, mine = type(module).__name__, type(model).__name__
        fix = "make it from this model's modules, or give their dotted paths, which fit every copy"
        if _HOOK in module.__dict__:
            raise ScaleLongError(
                f"skip {index}: SkipInput.module is a {what} of another model, one ScaleLong is applied to, "
                f"not of this {mine}: the declaration is stale (made for that model); {fix}"
            )
        raise ScaleLongError(
            f"skip {index}: SkipInput.module must be a submodule of the model or its path; this {what} is "
            f"not one of this {mine} (a declaration made for another model?); {fix}"
        )


def _check_shapes(shapes: object, count: int) -> tuple[tuple[int | None, ...] | None, ...]:
    """One shape (without the batch) or None per skip, as a tuple of tuples; one line otherwise."""
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Sequence) or len(shapes) != count:
        given = len(shapes) if isinstance(shapes, Sequence) else type(shapes).__name__
        raise ScaleLongError(f"shapes gives {given} skip shapes for {count} skips; give one per skip")

    def size(side: object) -> bool:
        return side is None or (isinstance(side, int) and not isinstance(side, bool) and side >= 0)

    checked = []
    for index, shape in enumerate(shapes, start=1):
        ok = shape is None or (
            isinstance(shape, Sequence) and not isinstance(shape, (str, bytes)) and all(map(size, shape))
        )
        if not ok:
            raise ScaleLongError(
                f"skip {index}: its shape must be a sequence of sizes (None where unknown), got {shape!r}"
            )
        checked.append(None if shape is None else tuple(shape))
    return tuple(checked)


def _blocks(model: nn.Module, blocks: Mapping[str, nn.Module | str]) -> dict[str, nn.Module]:
    """The watched blocks as submodules of ``model``: a path is looked up in it, a module must be one
    of its own (a block of another model would be watched in place of this one's, silently)."""
    if not isinstance(blocks, Mapping):
        raise ScaleLongError(
            f"blocks must map names to submodules or their paths, got {type(blocks).__name__}"
        )
    own = {id(m) for m in model.modules()}
    found: dict[str, nn.Module] = {}
    for name, block in blocks.items():
        if isinstance(block, str):
            try:
                found[name] = model.get_submodule(block)
            except AttributeError:
                raise ScaleLongError(
                    f"block {name!r}: {type(model).__name__} has no submodule {block!r} (blocks found on "
                    "another model?); give the paths as this model's named_modules() lists them"
                ) from None
        elif isinstance(block, nn.Module) and id(block) in own:
            found[name] = block
        else:
            raise ScaleLongError(
                f"block {name!r} is a {type(block).__name__} that is not a submodule of this "
                f"{type(model).__name__} (a block of another model?); give its dotted path in this one"
            )
    return found


def _check_not_applied(model: nn.Module, skips: Sequence[SkipInput]) -> None:
    hooked = any(isinstance(s.module, nn.Module) and _HOOK in s.module.__dict__ for s in skips)
    if installed(model) or isinstance(getattr(model, "scalelong", None), SkipScaling) or hooked:
        raise ScaleLongError(
            "ScaleLong is already applied to this model (or to a model that holds it); "
            "call remove_scalelong on that model first"
        )
    if find_skip_scaling(model) is not None:
        raise ScaleLongError(
            f"{type(model).__name__} already holds a SkipScaling (a scalelong backbone, or ScaleLong "
            "applied to a submodule): choose the method where it was made (skip_method= of the backbone)"
        )
    if hasattr(model, "scalelong"):
        raise ScaleLongError(
            f"{type(model).__name__} already has an attribute 'scalelong'; ScaleLong needs that name"
        )


def _resolve(
    model: nn.Module, skips: Sequence[SkipInput]
) -> tuple[tuple[list[SkipInput], list[_Spec]], list[tuple[nn.Module, list[_Spec]]]]:
    """Check every SkipInput; return (the declaration with paths, the specs), and the specs grouped
    by submodule in declaration order."""
    paths: dict[int, str] = {}
    for path, m in model.named_modules():
        paths.setdefault(id(m), path)
    grouped: dict[int, tuple[nn.Module, list[_Spec]]] = {}
    declared, specs, seen = [], [], set()
    for index, skip in enumerate(skips, start=1):
        module, path = _module(model, skip.module, paths, index)
        position, name = locate(module, skip, index)
        _check_slice(skip, index)
        if skip.item is not None and (isinstance(skip.item, bool) or not isinstance(skip.item, int)):
            raise ScaleLongError(
                f"skip {index}: SkipInput.item must be an int (a tuple position), got {skip.item!r}"
            )
        where = position if position is not None else name
        key = (id(module), where, skip.item, _slice_key(skip.channels), skip.dim)
        if key in seen:
            raise ScaleLongError(
                f"skip {index} declares the same input as an earlier skip; list each skip once"
            )
        seen.add(key)
        spec = _Spec(index, position, name, skip.channels, skip.dim, skip.item)
        grouped.setdefault(id(module), (module, []))[1].append(spec)
        declared.append(skip._replace(module=path))
        specs.append(spec)
    return (declared, specs), list(grouped.values())


def _module(
    model: nn.Module, module: nn.Module | str, paths: dict[int, str], index: int
) -> tuple[nn.Module, str]:
    """(submodule, its path) for ``SkipInput.module``, a submodule of ``model`` or its path."""
    if isinstance(module, str):
        try:
            found = model.get_submodule(module)
        except AttributeError:
            raise ScaleLongError(
                f"skip {index}: {type(model).__name__} has no submodule {module!r}; give its dotted path "
                "as model.named_modules() lists it"
            ) from None
        return found, module
    if not isinstance(module, nn.Module) or id(module) not in paths:
        raise ScaleLongError(
            f"skip {index}: SkipInput.module must be a submodule of the model or its path; "
            f"this {type(module).__name__} is not one"
        )
    return module, paths[id(module)]


def _check_slice(skip: SkipInput, index: int) -> None:
    if isinstance(skip.dim, bool) or not isinstance(skip.dim, int):
        raise ScaleLongError(f"skip {index}: SkipInput.dim must be an int, got {skip.dim!r}")
    c = skip.channels
    if c is None:
        return
    ints = isinstance(c, slice) and all(v is None or type(v) is int for v in (c.start, c.stop))
    if not ints or c.step not in (None, 1):
        raise ScaleLongError(
            f"skip {index}: SkipInput.channels must be a contiguous slice such as slice(-64, None), got {c!r}"
        )


def _slice_key(c: slice | None) -> tuple | None:
    return None if c is None else (c.start, c.stop)


# ----------------------------------------------------------------------------- the hook


def _scale_inputs_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: replace each declared skip input of ``module`` with its scaled version."""
    scaling: SkipScaling = module.__dict__[_REF]
    for spec in module.__dict__[_SPECS]:
        if spec.position is not None and spec.position < len(args):
            new = _scaled_input(scaling, spec, args[spec.position], module)
            args = (*args[: spec.position], new, *args[spec.position + 1 :])
        elif spec.name is not None and spec.name in kwargs:
            kwargs = {**kwargs, spec.name: _scaled_input(scaling, spec, kwargs[spec.name], module)}
        else:
            what = spec.name if spec.name is not None else f"at position {spec.position}"
            raise ScaleLongError(
                f"{type(module).__name__} was called without its input {what}, declared as skip "
                f"{spec.index}; fix that SkipInput"
            )
    return args, kwargs


def _scaled_input(scaling: SkipScaling, spec: _Spec, value: object, module: nn.Module) -> object:
    """The input with the skip it carries scaled: the tensor itself, or one element of a tuple."""
    if spec.item is None:
        return _scaled(scaling, spec, value, module)
    if not isinstance(value, (tuple, list)):
        raise ScaleLongError(
            f"skip {spec.index}: the declared input of {type(module).__name__} is a {type(value).__name__}, "
            "not a tuple; drop item= or fix that SkipInput"
        )
    if not -len(value) <= spec.item < len(value):
        raise ScaleLongError(
            f"skip {spec.index}: item {spec.item} of a {len(value)}-element input of "
            f"{type(module).__name__}; fix that SkipInput"
        )
    items = list(value)  # a new sequence: the caller's is left as it was
    items[spec.item] = _scaled(scaling, spec, value[spec.item], module)
    return tuple(items) if isinstance(value, tuple) else items


def _scaled(scaling: SkipScaling, spec: _Spec, value: object, module: nn.Module) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ScaleLongError(
            f"skip {spec.index}: the declared input of {type(module).__name__} is a {type(value).__name__}, "
            "not a tensor; fix that SkipInput"
        )
    if spec.channels is None:
        return scaling(value, spec.index)
    dim = spec.dim % value.ndim
    size = value.shape[dim]
    start, stop, _ = spec.channels.indices(size)
    if stop <= start:
        raise ScaleLongError(
            f"skip {spec.index}: channels {spec.channels} select nothing of an input with {size} along dim "
            f"{spec.dim}; fix that SkipInput"
        )
    skip = value.narrow(dim, start, stop - start)
    out = scaling(skip, spec.index)
    if out is skip:  # coefficient 1: the input goes on as it came, bit for bit and without a copy
        return value
    # [before | scaled skip | after] along dim: only the skip's slice changes
    parts = (value.narrow(dim, 0, start), out, value.narrow(dim, stop, size - stop))
    return torch.cat([p for p in parts if p.shape[dim] > 0], dim=dim)
