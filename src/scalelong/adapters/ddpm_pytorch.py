"""Where the long skips of denoising-diffusion-pytorch's ``Unet`` enter its decoder.

``denoising_diffusion_pytorch.Unet.forward`` (checked against version 2.3) makes its skips as
local tensors and merges them in its own body, not through a block argument::

    x = init_conv(x); r = x.clone()                      # skip 1
    for block1, block2, attn, downsample in downs:       # each level pushes two skips
        x = block1(x, t); h.append(x)
        x = block2(x, t); x = attn(x) + x; h.append(x)
        x = downsample(x)
    ... mid ...
    for block1, block2, attn, upsample in ups:           # innermost level first
        x = block1(cat((x, h.pop()), 1), t)
        x = block2(cat((x, h.pop()), 1), t); ...
    x = final_res_block(cat((x, r), 1), t)

Scaling at the producer would also scale the encoder's main path, and the list ``h`` is local,
so the one sound hook point is the consumer: a forward pre-hook on each ``ResnetBlock`` that
receives a concatenated tensor, scaling only the skip's channel slice of its first argument.

Channel slice arithmetic. ``cat((x, skip), dim=1)`` puts the skip last, so the skip is the tail
``slice(-w, None)`` of the block's input, w the skip's width, whatever the width of ``x``. The
widths come from the producers: skip 1 (r) has ``init_conv.out_channels``; the two skips of down
level l have the width of that level's ``ResnetBlock(dims[l], dims[l])``. As a check of the stack
order, every consumer ``ResnetBlock(width(x) + w, width(x))`` must then satisfy
``in_channels - out_channels == w`` for the skip it pops; a layout that does not is refused.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from scalelong.errors import ScaleLongError


def unet_layout(unet: nn.Module) -> dict[str, Any]:
    """Skip inputs (outermost first), skip widths and blocks of a ``denoising_diffusion_pytorch.Unet``.

    N = 2 * len(dim_mults) + 1 skips: skip 1 = the init conv's output (merged before
    ``final_res_block``), then two per down level, from the outermost level in.
    """
    # producers in push order = outermost first: r, then (block1 output, block2 + attn output) per level
    widths = [unet.init_conv.out_channels]
    for block1, *_ in unet.downs:
        widths += [_width(block1)[1]] * 2
    # consumers, outermost first: the outermost up level runs last, and its block2 pops the skip
    # that was pushed first (by the outermost down level's block1)
    consumers = [unet.final_res_block]
    for block1, block2, *_ in reversed(unet.ups):
        consumers += [block2, block1]
    merged = [i - o for i, o in map(_width, consumers)]
    if merged != widths:
        raise ScaleLongError(
            f"this Unet's encoder pushes skips of widths {widths} (outermost first) but its decoder merges "
            f"{merged}; this denoising_diffusion_pytorch version or layout is not supported"
        )
    skips = [(block, 0, slice(-w, None)) for block, w in zip(consumers, widths, strict=True)]
    return {"skips": skips, "skip_channels": widths, "blocks": _blocks(unet)}


def _width(block: nn.Module) -> tuple[int, int]:
    """(input, output) channels of a ``ResnetBlock``: those of its first conv."""
    conv = block.block1.proj
    return conv.in_channels, conv.out_channels


def _blocks(unet: nn.Module) -> dict[str, nn.Module]:
    """The ResnetBlocks in forward order, named by their path in the Unet (``downs.0.0`` = block1)."""
    blocks: dict[str, nn.Module] = {}
    for l, (block1, block2, *_) in enumerate(unet.downs):
        blocks[f"downs.{l}.0"], blocks[f"downs.{l}.1"] = block1, block2
    blocks["mid_block1"], blocks["mid_block2"] = unet.mid_block1, unet.mid_block2
    for l, (block1, block2, *_) in enumerate(unet.ups):
        blocks[f"ups.{l}.0"], blocks[f"ups.{l}.1"] = block1, block2
    blocks["final_res_block"] = unet.final_res_block
    return blocks
