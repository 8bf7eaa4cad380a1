"""Where the long skips of diffusers' U-ViT enter its decoder (UniDiffuser's transformer).

diffusers ships the U-ViT of UniDiffuser as ``UTransformer2DModel`` (and ``UniDiffuserModel``,
its text/image heads around one ``UTransformer2DModel`` at ``.transformer``) under
``diffusers.pipelines.deprecated.unidiffuser.modeling_uvit``. Its forward keeps the output of
every in-block on a stack, and each out-block first merges the top of the stack in a
``SkipBlock``: ``skip_linear(cat([x, skip], -1))`` then LayerNorm, called as
``out_block["skip"](x, skips.pop())``. So skip i (1 = the first in-block's output, next to the
input) is the ``skip`` argument of the ``SkipBlock`` of the last-but-(i-1) out-block, and a
pre-hook on it scales exactly the skip, never the decoder stream.

The skips are (B, L, D) tokens: the LS gate needs the token count L, derived from the config.

``UniDiffuserModel`` is served by the same hooks on its inner transformer, with ScaleLong
registered on the outer model (``model.scalelong``): the inner transformer sees more tokens there
(the two timestep tokens, the text tokens, the CLIP image token, the optional data-type token and
the patches), which only the outer config knows.

These functions only read the model; :mod:`scalelong.adapters` installs what they describe.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from scalelong.errors import ScaleLongError


def utransformer_layout(model: nn.Module) -> dict[str, Any]:
    """Skip inputs (outermost first), token count and blocks of a ``UTransformer2DModel``.

    L is the number of patches, (sample_size // patch_size) ** 2: the input the model embeds
    itself. (Called with ``hidden_states_is_embedding=True`` on other tokens, the LS gate raises.)
    """
    c = model.config
    return _with_tokens(_skips_and_blocks(model), (c.sample_size // c.patch_size) ** 2, c)


def unidiffuser_layout(model: nn.Module) -> dict[str, Any]:
    """As :func:`utransformer_layout` for the ``UTransformer2DModel`` inside a ``UniDiffuserModel``.

    L = 2 timestep tokens + text tokens + 1 CLIP image token (+ 1 data-type token) + patches:
    the sequence ``UniDiffuserModel.forward`` hands its transformer.
    """
    c = model.config
    patches = (c.sample_size // c.patch_size) ** 2
    num_tokens = 2 + c.num_text_tokens + 1 + int(bool(c.use_data_type_embedding)) + patches
    return _with_tokens(_skips_and_blocks(model.transformer, "transformer."), num_tokens, c)


def _with_tokens(spec: dict[str, Any], num_tokens: int, config: Any) -> dict[str, Any]:
    """The layout with its token count L and every skip's shape (L, D), D = heads * head width."""
    width = config.num_attention_heads * config.attention_head_dim
    return {**spec, "num_tokens": num_tokens, "shapes": [(num_tokens, width)] * len(spec["skips"])}


def _skips_and_blocks(transformer: nn.Module, prefix: str = "") -> dict[str, Any]:
    ins, outs = transformer.transformer_in_blocks, transformer.transformer_out_blocks
    n = len(ins)
    if n == 0 or len(outs) != n:
        raise ScaleLongError(
            f"this U-ViT has {n} in-blocks and {len(outs)} out-blocks, so no long skips to scale; "
            "build it with num_layers >= 3"
        )
    # out-block k merges the skip of in-block n-1-k (a stack), so skip i meets out-block n-i
    skips = [(outs[n - i]["skip"], "skip") for i in range(1, n + 1)]
    # named by their path in the model; an out-block is a ModuleDict with no forward of its own,
    # so its feature is that of its transformer block
    blocks = {f"{prefix}transformer_in_blocks.{k}": b for k, b in enumerate(ins)}
    blocks[f"{prefix}transformer_mid_block"] = transformer.transformer_mid_block
    blocks.update({f"{prefix}transformer_out_blocks.{k}.block": ob["block"] for k, ob in enumerate(outs)})
    return {"skips": skips, "blocks": blocks}
