"""Where the long skips of diffusers' UNets enter their decoder: ``UNet2DModel`` and
``UNet2DConditionModel``.

diffusers keeps every encoder output on a tuple (``down_block_res_samples``) and hands each up
block the last ``len(block.resnets)`` entries as its ``res_hidden_states_tuple`` argument (by
position in ``UNet2DModel``, by keyword in ``UNet2DConditionModel``); the block pops them from the
end, one per resnet, and concatenates each onto its stream. So skip ``i`` is one element of one up
block's tuple, and a pre-hook on the up block scales exactly the skips, on the consumer side only:
on the producer side the same tensors are also the encoder's main path.

Skip indices follow the package convention: 1 = conv-in output (outermost), N = last down-block
output (innermost). Up block k receives the consecutive indices ending at N - (skips taken by the
up blocks before it), element j of its tuple being the j-th of them.

The layout also names the UNet's blocks for the diagnostics, in forward order (``down_blocks.0``,
..., ``mid_block``, ``up_blocks.0``, ...), so ``Diagnostics`` records them through any module
that holds the UNet and, in a deep copy (an EMA model), the copy's own blocks.

These functions only read the model; :mod:`scalelong.adapters` installs what they describe.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from scalelong.errors import ScaleLongError


def skip_layout(unet: nn.Module) -> list[tuple[int, int | None, int | None]]:
    """(channels, height, width) of every skip, outermost first; sides are None without sample_size."""
    size = unet.config.sample_size
    h, w = (size, size) if isinstance(size, int) else (tuple(size) if size else (None, None))
    layout = [(unet.conv_in.out_channels, h, w)]
    for block in unet.down_blocks:
        layout += [(r.out_channels, h, w) for r in block.resnets]
        if getattr(block, "downsamplers", None):
            h, w = (None, None) if h is None else ((h + 1) // 2, (w + 1) // 2)
            layout.append((block.downsamplers[0].out_channels, h, w))
    consumed = sum(len(b.resnets) for b in unet.up_blocks)
    if consumed != len(layout):
        raise ScaleLongError(
            f"{type(unet).__name__} produces {len(layout)} skips but its up blocks consume {consumed}; "
            "this block layout is not supported"
        )
    return layout


def unet_blocks(unet: nn.Module) -> dict[str, nn.Module]:
    """The UNet's blocks in forward order, named as in its state dict: ``down_blocks.0``, ...,
    ``mid_block`` (when it has one), ``up_blocks.0``, ... (diffusers registers ``up_blocks``
    before ``mid_block``, so registration order is not forward order)."""
    blocks = {f"down_blocks.{i}": b for i, b in enumerate(unet.down_blocks)}
    if unet.mid_block is not None:
        blocks["mid_block"] = unet.mid_block
    blocks.update((f"up_blocks.{i}", b) for i, b in enumerate(unet.up_blocks))
    return blocks


def unet_layout(unet: nn.Module) -> dict[str, Any]:
    """Skip inputs (outermost first), widths, shapes and blocks of a diffusers UNet."""
    layout = skip_layout(unet)
    skips: list[tuple | None] = [None] * len(layout)
    remaining = len(layout)
    for k, block in enumerate(unet.up_blocks):
        remaining -= len(block.resnets)
        for j in range(len(block.resnets)):  # element j of the tuple is skip remaining + 1 + j
            skips[remaining + j] = (f"up_blocks.{k}", "res_hidden_states_tuple", None, 1, j)
    return {
        "skips": skips,
        "skip_channels": [c for c, _, _ in layout],
        "shapes": list(layout),
        "blocks": unet_blocks(unet),
    }
