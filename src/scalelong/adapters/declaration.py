"""A declaration of long skips as plain data: :class:`SkipInput`, and how it names an input.

A long skip reaches the decoder as an input of some submodule; a :class:`SkipInput` names that
submodule (the module, or its dotted path in the model), the input, for a tuple the element, and
for a concatenated input the skip's channel slice. The installer
(:mod:`scalelong.adapters.declared`), the per-family layouts, the tracer of
:func:`scalelong.find_skips` (:mod:`scalelong.adapters.tracing`) and the check of a hand-written
declaration (:mod:`scalelong.adapters.checking`) all speak it; :func:`locate` reads which input of a
module's ``forward`` it means, and :func:`input_text` names that input as
:func:`scalelong.describe` prints it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

from torch import nn

from scalelong.errors import ScaleLongError

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class SkipInput(NamedTuple):
    """One long skip as the decoder receives it: an input of one submodule of the model.

    Attributes:
        module: the submodule whose forward receives the skip (the merge layer, or the decoder
            block that the concatenated tensor or the tuple of skips is handed to), or its dotted
            path in the model (``"dec.3"``, as ``model.get_submodule`` reads it).
        arg: which input of ``module.forward``: its position (0 = the first after ``self``)
            or its parameter name. Either way the skip is found whether the caller passes it
            by position or by keyword.
        channels: ``slice(start, stop)`` along ``dim`` when the input is the skip already
            concatenated with the decoder stream: only that slice is scaled. ``None``: the
            whole input is the skip. For ``torch.cat([x, skip], 1)`` with a skip of ``w``
            channels, ``slice(-w, None)`` is the tail, whatever the width of ``x``.
        dim: the axis ``channels`` indexes: 1 for (B, C, H, W) maps, -1 for (B, L, D) tokens.
        item: when the input is a tuple (or list) of tensors, the position of the skip in it
            (negative counts from the end); ``channels`` then slices that element. None: the input
            is a tensor.
    """

    module: nn.Module | str
    arg: int | str = 0
    channels: slice | None = None
    dim: int = 1
    item: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """This declaration as JSON-ready data; ``module`` must be a path (the installer records paths)."""
        if not isinstance(self.module, str):
            raise ScaleLongError("SkipInput.to_dict needs the module as its path in the model (a string)")
        c = self.channels
        return {
            "module": self.module,
            "arg": self.arg,
            "channels": None if c is None else [c.start, c.stop],
            "dim": self.dim,
            "item": self.item,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SkipInput:
        """The inverse of :meth:`to_dict`."""
        c = data.get("channels")
        return cls(
            data["module"],
            data.get("arg", 0),
            None if c is None else slice(*c),
            data.get("dim", 1),
            data.get("item"),
        )


def locate(module: nn.Module, skip: SkipInput, index: int) -> tuple[int | None, str | None]:
    """(position in ``args``, keyword) of the input of ``module.forward`` that ``skip`` declares;
    one :class:`ScaleLongError` naming skip ``index`` where it has no such input."""
    arg = skip.arg
    what = f"skip {index}: {type(module).__name__}.forward"
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # a forward without a readable signature: trust the declaration
        params = [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)]
    positional = [p for p in params if p.kind in _POSITIONAL]
    var_positional = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    if isinstance(arg, int) and not isinstance(arg, bool):
        if arg < 0 or (arg >= len(positional) and not var_positional):
            raise ScaleLongError(
                f"{what} takes {len(positional)} positional inputs; arg={arg} is not one of them"
            )
        named = arg < len(positional) and positional[arg].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        return arg, positional[arg].name if named else None
    if isinstance(arg, str):
        for i, p in enumerate(positional):
            if p.name == arg:
                return i, (arg if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else None)
        if any(p.name == arg and p.kind is inspect.Parameter.KEYWORD_ONLY for p in params) or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params
        ):
            return None, arg
        raise ScaleLongError(f"{what} has no input named {arg!r}")
    raise ScaleLongError(f"skip {index}: SkipInput.arg must be a position (int) or a name (str), got {arg!r}")


def input_text(position: int | None, name: str | None, item: int | None) -> str:
    """How :func:`scalelong.describe` names an input: ``skip``, ``args[2]``,
    ``res_hidden_states_tuple[1]``."""
    text = name if name is not None else f"args[{position}]"
    return text if item is None else f"{text}[{item}]"
