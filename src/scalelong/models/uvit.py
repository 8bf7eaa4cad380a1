"""U-ViT (Bao et al., "All are Worth Words", CVPR 2023) with ScaleLong on its long skips.

Parameter names follow the released U-ViT, so released checkpoints load without renaming.
All conditioning (time, class, text) enters as tokens prepended to the patch tokens, in the
release's order: [label, time, patches] for class-conditional models (sail-sg/ScaleLong and
baofff/U-ViT ``libs/uvit.py``), [time, context, patches] for text-to-image ones
(baofff/U-ViT ``libs/uvit_t2i.py``). The long skips join the in-blocks to the out-blocks in
LIFO order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from scalelong.errors import ScaleLongError
from scalelong.skips import DEFAULT_KAPPA, SkipScaling, skip_coefficients

SKIP_LINEAR_INITS = ("release", "xavier")
SKIP_SCALE_INITS = ("none", "cs")


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding of (B,) times -> (B, dim), cos half first as in the release."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        qkv = self.qkv(x).reshape(B, L, 3, self.num_heads, D // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, L, D / H)
        if q.device.type == "cpu" and q.dtype == torch.bfloat16 and torch.is_autocast_enabled("cpu"):
            # Under torch's CPU bf16 autocast: two bf16 matrix products around an fp32 softmax, as GPU
            # kernels compute bf16 attention. The CPU's bf16 SDPA kernels take 3.6x as long as its fp32
            # ones at U-ViT's sizes, and these two products 0.78x (benchmarks/train_step.py). Under
            # scalelong.fp16's policy SDPA is one fp32 kernel on bf16 values, as for fp16.
            scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, H, L, L)
            x = scores.float().softmax(dim=-1).to(q.dtype) @ v
        else:
            x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, L, D))


class Mlp(nn.Module):
    """The block's MLP. With ``grid > 0`` a depthwise 3x3 convolution over the grid x grid patch
    tokens (the last grid**2 of the sequence) is added to the hidden layer before the activation,
    as in the convolutional feed-forward of LocalViT (Li et al. 2021) and PVT v2 (Wang et al. 2022);
    the conditioning tokens in front pass through unchanged."""

    def __init__(self, dim: int, hidden: int, grid: int = 0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.grid = grid
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden) if grid else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.dwconv is not None:
            extras, patches = h.split([h.shape[1] - self.grid**2, self.grid**2], dim=1)
            image = patches.transpose(1, 2).unflatten(2, (self.grid, self.grid))  # (B, hidden, g, g)
            patches = patches + self.dwconv(image).flatten(2).transpose(1, 2)
            h = torch.cat([extras, patches], dim=1)
        return self.fc2(self.act(h))


def _unchanged(x: torch.Tensor) -> torch.Tensor:
    return x


class Block(nn.Module):
    """Pre-LN transformer block; an out-block first merges the (scaled) long skip.

    ``after_merge`` receives the merge layer's output (``SkipScaling.after_merge`` of this skip:
    a LayerNorm under ``merge-norm``, the tensor itself otherwise).
    """

    def __init__(
        self, dim: int, num_heads: int, mlp_ratio: float, qkv_bias: bool, merges_skip: bool, grid: int = 0
    ):
        super().__init__()
        self.skip_linear = nn.Linear(2 * dim, dim) if merges_skip else None
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), grid)

    def forward(
        self,
        x: torch.Tensor,
        skip: torch.Tensor | None = None,
        after_merge: Callable[[torch.Tensor], torch.Tensor] = _unchanged,
    ) -> torch.Tensor:
        if self.skip_linear is not None:
            x = after_merge(self.skip_linear(torch.cat([x, skip], dim=-1)))  # (B, L, 2D) -> (B, L, D)
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, patch_size: int, in_channels: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, P, D)


class UViT(nn.Module):
    """U-ViT denoiser: ``forward(x, t, y=None, context=None)`` -> epsilon of x's shape.

    Args:
        img_size: side of the (square) input image or latent.
        patch_size: side of a patch; tokens = (img_size / patch_size) ** 2.
        in_channels: channels of x.
        embed_dim: width D of every token.
        depth: transformer blocks besides the middle one: depth // 2 in, 1 mid, depth // 2 out.
        num_heads: attention heads.
        mlp_ratio: hidden width of the MLPs as a multiple of D.
        qkv_bias: bias on the qkv projection (the release has none).
        num_classes: > 0 adds a class token (labels 0 .. num_classes - 1) in front of the time
            token, as the release does; 0 means unconditional. ``forward`` then requires ``y``
            (and refuses one when 0).
        context_dim: > 0 adds ``context_tokens`` text tokens projected from this width, after
            the time token; ``forward`` then requires ``context`` (and refuses one when 0).
        context_tokens: number of text tokens (77 for CLIP).
        conv_out: the release's final 3x3 convolution after unpatchify.
        mlp_conv: a depthwise 3x3 convolution over the patch grid inside every block's MLP
            (:class:`Mlp`), giving each block the locality a convolutional UNet has; off in the
            release. It adds ``10 * mlp_ratio * D`` parameters per block (weights and biases).
        skip_linear_init: how the out-blocks' ``skip_linear`` (2D -> D, on the main path) start.
            ``release``: trunc_normal(std 0.02) like every other linear layer of the release. That
            multiplies the features by about 0.02 * sqrt(2D) per out-block (0.64 at the release's
            D = 512, 0.23 at D = 64), so in a narrow model the gradient reaching the inner blocks
            shrinks geometrically with depth. ``xavier``: Glorot-uniform, which keeps the scale
            near 1 at any width.
        skip_linear_skip_scale_init: ``cs`` multiplies, at initialisation, the skip half of each
            out-block's ``skip_linear`` weight (the columns that act on the skip in
            ``cat([x, skip])``) by the coefficient ``cs`` gives that skip, ``kappa ** (i - 1)``;
            only with ``skip_method="none"``; ``skip_method="cs-init"`` is the same model under a
            method name a study can sweep. At initialisation the model then computes what
            ``cs`` computes (``W (c s) = (c W) s``: bit for bit when kappa is a power of two, else
            up to rounding), with the same parameters and names, but the scale lives in the
            weights. Under AdamW the two then part: ``cs`` scales that weight's gradient by ``c``,
            which Adam normalises away, so under ``cs`` the skip half's effect on the output
            (``c W``) moves ``c`` times more slowly (up to Adam's epsilon and the global gradient
            clipping, which sees the smaller gradient). A study that trains ``none`` with this
            option against ``cs`` separates the two parts of CS: a smaller start, and slower
            learning of the skip path. ``none``: the init of ``skip_linear_init`` alone (the
            release).
        mlp_time_embed: pass the sinusoidal time embedding through the release's
            Linear(D, 4D) -> SiLU -> Linear(4D, D) (``time_embed.0``, ``time_embed.2``);
            False (the release's configs) uses the sinusoid itself as the time token.
        skip_method: the ScaleLong method on the long skips, one of ``scalelong.skips.METHODS``;
            ``skip-norm`` puts a LayerNorm(D) on each skip, ``merge-norm`` one after each
            ``skip_linear``, ``cs-init`` is ``skip_linear_skip_scale_init="cs"`` (see there).
        kappa: base of ``cs`` (and ``cs-init``): skip i (1 = outermost) is scaled by ``kappa ** (i - 1)``.
        ls_reduction: reduction r of the LS token gates (Linear(L -> L // r) -> ... -> L).
    """

    def __init__(
        self,
        img_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 3,
        embed_dim: int = 512,
        depth: int = 12,
        num_heads: int = 8,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        num_classes: int = 0,
        context_dim: int = 0,
        context_tokens: int = 77,
        conv_out: bool = True,
        mlp_time_embed: bool = False,
        mlp_conv: bool = False,
        skip_linear_init: str = "release",
        skip_linear_skip_scale_init: str = "none",
        skip_method: str = "none",
        kappa: float = DEFAULT_KAPPA["uvit"],
        ls_reduction: int = 16,
    ):
        super().__init__()
        self.img_size, self.patch_size, self.in_channels = img_size, patch_size, in_channels
        self.embed_dim = embed_dim
        self.num_classes = num_classes
        self.patch_embed = PatchEmbed(patch_size, in_channels, embed_dim)
        grid = img_size // patch_size
        num_patches = grid**2
        self.time_embed = (
            nn.Sequential(nn.Linear(embed_dim, 4 * embed_dim), nn.SiLU(), nn.Linear(4 * embed_dim, embed_dim))
            if mlp_time_embed
            else nn.Identity()
        )
        self.label_emb = nn.Embedding(num_classes, embed_dim) if num_classes > 0 else None
        self.context_embed = nn.Linear(context_dim, embed_dim) if context_dim > 0 else None
        self.extras = 1 + (num_classes > 0) + (context_tokens if context_dim > 0 else 0)
        self.num_tokens = self.extras + num_patches
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_tokens, embed_dim))

        def block(merges_skip: bool) -> Block:
            return Block(embed_dim, num_heads, mlp_ratio, qkv_bias, merges_skip, grid if mlp_conv else 0)

        self.in_blocks = nn.ModuleList(block(False) for _ in range(depth // 2))
        self.mid_block = block(False)
        self.out_blocks = nn.ModuleList(block(True) for _ in range(depth // 2))
        self.norm = nn.LayerNorm(embed_dim)
        self.decoder_pred = nn.Linear(embed_dim, patch_size**2 * in_channels)
        self.final_layer = nn.Conv2d(in_channels, in_channels, 3, padding=1) if conv_out else nn.Identity()

        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.apply(_init_weights)
        if skip_linear_init not in SKIP_LINEAR_INITS:
            raise ScaleLongError(
                f"skip_linear_init={skip_linear_init!r}; choose one of {', '.join(SKIP_LINEAR_INITS)}"
            )
        if skip_linear_init == "xavier":
            for blk in self.out_blocks:
                nn.init.xavier_uniform_(blk.skip_linear.weight)
        # Created after the init above: the LS gates keep PyTorch's default init (coefficients ~0.5).
        self.skip_scaling = SkipScaling(
            skip_method,
            depth // 2,
            kappa,
            num_tokens=self.num_tokens,
            reduction=ls_reduction,
            skip_dim=embed_dim,
            merge_dim=embed_dim,  # skip_linear: (B, L, 2D) -> (B, L, D), one per skip
        )
        self._scale_skip_columns(skip_linear_skip_scale_init, skip_method, kappa)

    @torch.no_grad()
    def _scale_skip_columns(self, init: str, skip_method: str, kappa: float) -> None:
        """``skip_linear_skip_scale_init`` (and method ``cs-init``): cs's coefficients moved into the
        skip half of the weights."""
        if init not in SKIP_SCALE_INITS:
            raise ScaleLongError(
                f"skip_linear_skip_scale_init={init!r}; choose one of {', '.join(SKIP_SCALE_INITS)}"
            )
        if init != "none" and skip_method != "none":
            raise ScaleLongError(
                f"skip_linear_skip_scale_init={init!r} stands in for cs under skip_method='none'; "
                f"with skip_method={skip_method!r} the skips would be scaled twice"
            )
        coefficients = (  # skip 1 (outermost) first
            skip_coefficients("cs", len(self.out_blocks), kappa)
            if init == "cs"
            else self.skip_scaling.merge_weight_scales()
        )
        if coefficients is None:
            return
        for j, blk in enumerate(self.out_blocks):
            index = len(self.out_blocks) - j  # LIFO: out_blocks[0] merges the innermost skip
            blk.skip_linear.weight[:, self.embed_dim :] *= coefficients[index - 1]  # (D, 2D): [x | skip]

    @property
    def num_skips(self) -> int:
        return len(self.in_blocks)

    def skip_shapes(self, batch_size: int = 1) -> list[tuple[int, ...]]:
        """Shape of every long skip, outermost first."""
        return [(batch_size, self.num_tokens, self.embed_dim)] * self.num_skips

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        y: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.patch_embed(x)  # (B, P, D)
        time_token = self.time_embed(timestep_embedding(t, self.embed_dim).to(x.dtype)).unsqueeze(1)
        tokens = [time_token]  # (B, 1, D)
        if self.label_emb is not None:
            if y is None:
                raise ScaleLongError("this UViT is class-conditional: pass labels y")
            tokens.insert(0, self.label_emb(y).unsqueeze(1))  # the label token comes first
        elif y is not None:
            raise ScaleLongError(
                "this UViT is not class-conditional (num_classes=0): it takes no labels y; "
                "build it with num_classes > 0 to condition on labels"
            )
        if self.context_embed is not None:
            if context is None:
                n, width = self.extras - len(tokens), self.context_embed.in_features  # text tokens, width
                raise ScaleLongError(
                    f"this UViT is text-conditional: pass context, text embeddings of shape (B, {n}, {width})"
                )
            tokens.append(self.context_embed(context))
        elif context is not None:
            raise ScaleLongError(
                "this UViT is not text-conditional (context_dim=0): it takes no context; "
                "build it with context_dim > 0 to condition on text"
            )
        x = torch.cat([*tokens, x], dim=1) + self.pos_embed  # (B, L, D)

        skips = []
        for blk in self.in_blocks:
            x = blk(x)
            skips.append(x)
        x = self.mid_block(x)
        scaling = self.skip_scaling
        for blk in self.out_blocks:
            index = len(skips)  # innermost skip first: N, N-1, ..., 1
            x = blk(x, scaling(skips.pop(), index), partial(scaling.after_merge, index=index))

        x = self.decoder_pred(self.norm(x))[:, self.extras :]  # (B, P, p * p * C)
        return self.final_layer(self.unpatchify(x))

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        p, c = self.patch_size, self.in_channels
        h = w = self.img_size // p
        x = x.reshape(x.shape[0], h, w, p, p, c)
        return torch.einsum("bhwpqc->bchpwq", x).reshape(x.shape[0], c, h * p, w * p)


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
