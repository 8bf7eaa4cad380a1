"""The blocks of a model whose hidden features :class:`~scalelong.diagnostics.monitor.Diagnostics`
records: :func:`find_blocks`, declared by the backbone or an adapter, or found by their layout."""

from __future__ import annotations

from torch import nn

from scalelong.diagnostics.overflow import unwrap
from scalelong.skips import SkipScaling, find_skip_scaling


def find_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """Named blocks whose hidden features the diagnostics record, in forward order.

    A backbone may define ``diagnostic_blocks() -> dict[str, nn.Module]`` (or an iterable of
    ``(name, module)``); an adapter that installed ScaleLong on a third-party model declares
    them with :meth:`SkipScaling.watch_blocks`. Otherwise every element of a top-level
    ``nn.ModuleList`` is a block (``in_blocks.0``, ...), and so is a top-level child whose name
    ends in ``block`` (``mid_block``), in registration order, except that in diffusers' layout
    (``down_blocks``, ``mid_block``, ``up_blocks``) the middle block comes before the up blocks.
    """
    model = unwrap(model)
    if hasattr(model, "diagnostic_blocks"):
        return dict(model.diagnostic_blocks())
    scaling = find_skip_scaling(model)
    if scaling is not None and scaling.watched_blocks:
        return dict(scaling.watched_blocks)
    blocks: dict[str, nn.Module] = {}
    for name, child in model.named_children():
        if isinstance(child, SkipScaling):
            continue
        if isinstance(child, nn.ModuleList):
            blocks.update((f"{name}.{i}", m) for i, m in enumerate(child))
        elif name.endswith("block"):
            blocks[name] = child
    if "mid_block" in blocks and isinstance(getattr(model, "up_blocks", None), nn.ModuleList):
        # diffusers registers up_blocks before mid_block, but runs the middle first
        mid = {"mid_block": blocks.pop("mid_block")}
        up = {k: v for k, v in blocks.items() if k.startswith("up_blocks.")}
        blocks = {k: v for k, v in blocks.items() if k not in up} | mid | up
    return blocks
