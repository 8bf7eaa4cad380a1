"""A declaration of skips checked against the forward pass it describes.

A :class:`~scalelong.adapters.declaration.SkipInput` list written by hand can be wrong in ways the
installer cannot see from the modules alone, and each of them trains something other than
ScaleLong, in silence: skips listed innermost first (``cs`` then gives coefficient 1 to the
innermost skip, and every plot labels the wrong skip), a missing channel slice on a
concatenated input or one wider than the skip (the main path is scaled too), one narrower (part
of the skip is not), a skip left out or listed twice. :func:`check` traces one forward pass
(:mod:`scalelong.adapters.tracing`) and compares: for each declared input, which long skip it
carries and where that skip's channels lie; then that the declaration lists every long skip the
forward shows, once each, outermost first. Each mistake is one :class:`ScaleLongError` line that
names what was declared, what the forward shows and the declaration to write instead.

``apply_scalelong(model, method, skips=...)`` checks at once when it is given ``example=`` (one
forward pass without gradients, in eval mode, the random number generator restored), and
otherwise on the model's first call (:func:`check_at_first_call`): that call itself is watched as
it runs, its inputs and gradients untouched, and its end raises the error, so a wrong declaration
stops a run after one forward pass and before its first backward or optimizer step. The watch is
one-shot: a forward pre-hook and a forward hook on the model, removed at the end of the call (a
model compiled before its first call is not watched; check it with ``example=``). The tracer sees
each module's inputs before ScaleLong's own hooks scale them. Where the trace cannot pair the
skips by itself (no skip found, an ambiguous pairing), only what it can read is checked (the
slices of the inputs that carry a skip), and the rest is trusted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from scalelong.adapters import tracing
from scalelong.adapters.declaration import SkipInput, locate
from scalelong.errors import ScaleLongError
from scalelong.skips import ordinal

# In the model's __dict__: the handles of the first-call check's two hooks, and the trace in flight.
_CHECK, _SESSION = "_scalelong_first_call_check", "_scalelong_first_call_trace"
_OPT_OUT = "pass check=False to trust the declaration"


def check(model: nn.Module, skips: Sequence[SkipInput], args: tuple, kwargs: Mapping) -> None:
    """Raise one :class:`ScaleLongError` where ``skips`` (modules as paths in ``model``, outermost
    first) do not describe the long skips of ``model(*args, **kwargs)``, traced once."""
    try:
        reading = tracing.read(model, args, kwargs)
    except ScaleLongError:
        return  # the forward pass itself fails: the real call will say why
    compare(model, skips, reading)


def compare(model: nn.Module, skips: Sequence[SkipInput], reading: tracing.Reading) -> None:
    """Raise one :class:`ScaleLongError` where ``skips`` do not describe what ``reading`` shows."""
    try:
        chosen = tracing.pair(reading)
    except ScaleLongError:
        chosen = None  # the pairing is the user's to declare: check only the slices
    roots = reading.skip_roots()
    carried = [_carried(model, reading, roots, skip, index) for index, skip in enumerate(skips, start=1)]
    if chosen is None:
        return
    made = {id(m.root): k for k, m in enumerate(chosen, start=1)}
    order = []
    for index, (skip, root) in enumerate(zip(skips, carried, strict=True), start=1):
        if root is None:
            raise ScaleLongError(
                f"declared skip {index}, {_where(skip)}, carries none of the {len(chosen)} long skips the "
                f"forward pass of {reading.name} shows ({_list(chosen)}); declare those, outermost first "
                f"(find_skips lists them), or {_OPT_OUT}"
            )
        if id(root) not in made:
            return  # a skip of another level: not one the trace can place
        order.append(made[id(root)])
    _check_order(skips, order, chosen, reading.name)


def check_at_first_call(model: nn.Module, skips: Sequence[SkipInput]) -> None:
    """Check ``skips`` (modules as paths) against the first call of ``model`` (see the module's
    docstring): a forward pre-hook begins a trace of that call, a forward hook ends it and compares."""
    begin = model.register_forward_pre_hook(_begin, with_kwargs=True, prepend=True)
    end = model.register_forward_hook(_end, always_call=True)
    model.__dict__[_CHECK] = (begin, end, tuple(skips))  # plain data: a deep copy gets its own


def cancel(model: nn.Module) -> None:
    """Drop the first-call check of ``model``, if one is still waiting."""
    begin, end, _ = model.__dict__.pop(_CHECK, (None, None, None))
    for handle in (begin, end):
        if handle is not None:
            handle.remove()
    model.__dict__.pop(_SESSION, None)


def _begin(model: nn.Module, args: tuple, kwargs: dict) -> None:
    if torch.compiler.is_compiling() or _SESSION in model.__dict__:
        return  # a model compiled before its first call is not checked (check it with example=)
    model.__dict__[_SESSION] = tracing.Session(model, args, kwargs)


def _end(model: nn.Module, args: tuple, output: object) -> None:
    session, (_, _, skips) = model.__dict__.get(_SESSION), model.__dict__.get(_CHECK, (None, None, ()))
    if session is None:
        return
    cancel(model)
    reading = session.end(args, output)
    if reading is not None:
        compare(model, skips, reading)


# ----------------------------------------------------------------------------- one declared input


def _carried(
    model: nn.Module,
    reading: tracing.Reading,
    roots: Mapping[int, tracing.Merge],
    skip: SkipInput,
    index: int,
) -> object | None:
    """The long skip (the trace's root) that declared input ``index`` carries, its slice checked;
    None where the forward shows none there (or the input is not a tensor the trace saw)."""
    module = model.get_submodule(skip.module)
    call = reading.first_call(module)
    if call is None:
        raise ScaleLongError(
            f"declared skip {index}: '{skip.module}' does not run in the forward pass of {reading.name}, so "
            f"this skip would never be scaled; declare the module that receives it"
        )
    position, name = locate(module, skip, index)
    info = None
    for key, item, tensor in call.inputs:
        if key not in (position, name) or (item is None) != (skip.item is None):
            continue
        if item is None or item == skip.item % max(call.lengths.get(key, 1), 1):
            info = tensor
    if info is None:
        return None
    if id(info.root) in roots:  # the whole input is the skip
        _check_whole(skip, index, info, roots[id(info.root)])
        return info.root
    layout = info.cat or (info.root.cat if info.root is not info else None)
    if layout is None:
        return None
    dim, operands = layout
    parts = [(op.root, start, size) for op, start, size in operands if id(op.root) in roots]
    if not parts:
        return None
    whole = info.shape[dim]
    root, start, size = _closest(skip, whole, parts)
    _check_cat(skip, index, info.shape, dim, start, size, roots[id(root)])
    return root


def _closest(skip: SkipInput, whole: int, parts: list[tuple[object, int, int]]) -> tuple[object, int, int]:
    """The skip operand the declared slice means: the one it overlaps most (the first if none)."""
    if skip.channels is None:
        return parts[0]
    a, b, _ = skip.channels.indices(whole)
    return max(parts, key=lambda p: min(b, p[1] + p[2]) - max(a, p[1]))


def _check_whole(skip: SkipInput, index: int, info: tracing._Tensor, merge: tracing.Merge) -> None:
    if skip.channels is None:
        return
    dim = skip.dim % len(info.shape)
    size = info.shape[dim]
    a, b, _ = skip.channels.indices(size)
    if (a, b) != (0, size):
        raise ScaleLongError(
            f"declared skip {index}: {_where(skip)} is the whole skip made by '{merge.root.producer}' "
            f"({size} along dim {skip.dim}), but channels={_text(skip.channels)} select {max(b - a, 0)} of "
            "them, so the rest would go unscaled; drop channels= (the whole input is the skip)"
        )


def _check_cat(
    skip: SkipInput, index: int, shape: tuple[int, ...], dim: int, start: int, size: int, merge: tracing.Merge
) -> None:
    """The declared slice selects exactly the skip's channels of a concatenated input."""
    whole, ndim = shape[dim], len(shape)
    right = tracing.cat_slice(start, size, whole)
    spelled = f"channels={_text(right)}" + ("" if dim == 1 else f", dim={tracing.dim_text(dim, ndim)}")
    what = (
        f"{_where(skip)} is a torch.cat of {whole} channels along dim {tracing.dim_text(dim, ndim)} "
        f"whose channels {start}:{start + size} are the skip made by '{merge.root.producer}'"
    )
    declared = f"declared skip {index}: {what}"
    if skip.channels is None:
        raise ScaleLongError(
            f"{declared}, but no channels= is declared, so all {whole} would be scaled, the main path "
            f"too; declare {spelled}"
        )
    if skip.dim % ndim != dim:
        raise ScaleLongError(f"{declared}, but channels= index dim {skip.dim}; declare {spelled}")
    a, b, _ = skip.channels.indices(whole)
    if (a, b) == (start, start + size):
        return
    chosen = f"channels={_text(skip.channels)} select {a}:{b}"
    if a <= start and b >= start + size:
        problem = f"{chosen}, wider than the skip, so part of the main path would be scaled too"
    elif a >= start and b <= start + size:
        problem = f"{chosen}, narrower than the skip, so part of it would go unscaled"
    else:
        problem = f"{chosen}, not the skip's channels"
    raise ScaleLongError(f"{declared}, but {problem}; declare {spelled}")


# ----------------------------------------------------------------------------- the whole declaration


def _check_order(
    skips: Sequence[SkipInput], order: list[int], chosen: list[tracing.Merge], name: str
) -> None:
    """Every long skip once, outermost first: ``order[i]`` is which one (1 = made first) skip i+1 carries."""
    n = len(chosen)
    seen: dict[int, int] = {}
    for index, k in enumerate(order, start=1):
        if k in seen:
            raise ScaleLongError(
                f"declared skips {seen[k]} and {index} both carry the skip made by "
                f"'{chosen[k - 1].root.producer}'; declare each long skip once"
            )
        seen[k] = index
    if order != sorted(order):
        inner_first = order == sorted(order, reverse=True)
        how = "innermost first" if inner_first else "out of order"
        made = ", ".join(ordinal(k) for k in order)
        declared = ", ".join(_short(s) for s in skips)
        right = ", ".join(_short(skips[order.index(k)]) for k in sorted(order))
        raise ScaleLongError(
            f"the skips are declared {how}: the forward pass of {name} shows that declared skips "
            f"1..{len(order)} ({declared}) carry the skips the encoder made {made} of {n}; skip 1 is the "
            f"outermost (made first, merged last): declare them in the order {right}"
        )
    if len(order) < n:
        missing = [m for k, m in enumerate(chosen, start=1) if k not in seen]
        raise ScaleLongError(
            f"the declaration lists {len(order)} skips, but the forward pass of {name} shows {n}: it leaves "
            f"out {_list(missing)}; declare every long skip, outermost first (find_skips lists them), or "
            f"{_OPT_OUT}"
        )


def _where(skip: SkipInput) -> str:
    """``input 0 of 'dec.3'``, ``input 'res_hidden_states_tuple' item 1 of 'up_blocks.0'``."""
    item = "" if skip.item is None else f" item {skip.item}"
    return f"input {skip.arg!r}{item} of '{skip.module}'"


def _short(skip: SkipInput) -> str:
    """``'dec.3'``, or ``'up_blocks.0'[1]`` for item 1 of a tuple input."""
    return repr(skip.module) + ("" if skip.item is None else f"[{skip.item}]")


def _list(merges: Sequence[tracing.Merge]) -> str:
    """``the skips made by 'enc.conv' (into input 0 of 'dec.1', channels=slice(-16, None)), ...``."""
    parts = []
    for m in merges:
        s = tracing.skip_input(m)
        cut = "" if s.channels is None else f", channels={_text(s.channels)}"
        parts.append(f"'{m.root.producer}' (into {_where(s)}{cut})")
    return f"the skip{'s' if len(parts) > 1 else ''} made by " + ", ".join(parts)


def _text(c: slice) -> str:
    return f"slice({c.start}, {c.stop})"
