"""Convolutional DDPM/ADM-style UNet (Ho et al. 2020; Dhariwal & Nichol 2021) with ScaleLong.

Encoder: conv-in, then per level ``num_res_blocks`` residual blocks (+ self-attention at the
chosen resolutions) and a downsample on every level but the last. Every one of these outputs
is a long skip: ``num_levels * (num_res_blocks + 1)`` skips in all (12 for the DDPM CIFAR-10
network). Decoder: per level ``num_res_blocks + 1`` blocks, each merging one skip, LIFO.
Skip 1 is the conv-in output (outermost), skip N the last encoder output (innermost).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from scalelong.errors import ScaleLongError
from scalelong.skips import DEFAULT_KAPPA, SkipScaling


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding of (B,) times -> (B, dim), sin half first as in DDPM."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device) / (half - 1))
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)


def layout_problem(
    img_size: int, channel_mult: Sequence[int], num_res_blocks: int, base_channels: int, attn_heads: int
) -> str | None:
    """Why these sizes do not make a UNet, starting with the argument's name; None when they do."""
    if not channel_mult or any(m < 1 for m in channel_mult):
        return f"channel_mult must be a non-empty list of ints >= 1, got {list(channel_mult)}"
    if num_res_blocks < 1:
        return f"num_res_blocks must be >= 1, got {num_res_blocks}"
    levels = len(channel_mult)
    if img_size % 2 ** (levels - 1):
        side = 2 ** (levels - 1)
        return f"img_size={img_size} must be divisible by 2 ** (levels - 1) = {side} for {levels} levels"
    for mult in channel_mult:
        if (base_channels * mult) % attn_heads:
            return (
                f"attn_heads={attn_heads} must divide every level width "
                f"(base_channels * channel_mult = {base_channels * mult})"
            )
    return None


def norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(groups, channels), channels, eps=1e-6)


class ResBlock(nn.Module):
    """GroupNorm-SiLU-conv, add the projected time embedding, GroupNorm-SiLU-dropout-conv, residual."""

    def __init__(self, in_ch: int, out_ch: int, emb_dim: int, dropout: float, groups: int):
        super().__init__()
        self.norm1 = norm(in_ch, groups)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.emb_proj = nn.Linear(emb_dim, out_ch)
        self.norm2 = norm(out_ch, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.shortcut = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        # in-place adds on conv outputs are safe (a conv's backward needs its input, not its
        # output) and save two full-size temporaries per block
        h = self.conv1(F.silu(self.norm1(x)))
        h += self.emb_proj(emb)[:, :, None, None]  # emb is already SiLU'd once for all blocks
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return h.add_(self.shortcut(x))


class AttnBlock(nn.Module):
    """Self-attention over all H*W positions with a residual.

    q, k, v and the output projection are Linear layers on the (B, HW, C) token view (the
    same maps as DDPM's 1x1 convolutions), so q, k, v come out with contiguous head
    channels and ``scaled_dot_product_attention`` takes its fused CPU/GPU kernels.
    """

    def __init__(self, channels: int, num_heads: int, groups: int):
        super().__init__()
        self.num_heads = num_heads
        self.norm = norm(channels, groups)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)  # (B, HW, C), a view
        qkv = self.qkv(tokens).reshape(B, H * W, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, heads, HW, C / heads)
        h = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, H * W, C)
        return x + self.proj(h).transpose(1, 2).view(B, C, H, W)


class Level(nn.Module):
    """A residual block optionally followed by attention: the unit both halves are made of."""

    def __init__(self, res: ResBlock, attn: AttnBlock | None):
        super().__init__()
        self.res, self.attn = res, attn

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        x = self.res(x, emb)
        return self.attn(x) if self.attn is not None else x


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor | None = None) -> torch.Tensor:
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class UNet(nn.Module):
    """DDPM/ADM-style UNet denoiser: ``forward(x, t, y=None)`` -> epsilon of x's shape.

    Args:
        img_size: side of the (square) input; must be divisible by 2 ** (levels - 1).
            (:func:`layout_problem` checks the sizes, here and when a config is validated.)
        in_channels: channels of x (and of the output).
        base_channels: width of level 0; level k has base_channels * channel_mult[k].
        channel_mult: width multiplier of each resolution level, highest resolution first.
        num_res_blocks: residual blocks per encoder level (the decoder has one more per level).
        attn_resolutions: feature-map sides at which a self-attention follows each res block.
        attn_heads: heads of those attentions (DDPM: 1).
        dropout: dropout inside the residual blocks.
        num_classes: > 0 adds a class embedding to the time embedding; 0 means unconditional.
        norm_groups: GroupNorm groups (capped at the width for tiny models).
        skip_method: the ScaleLong method on the long skips, one of ``scalelong.skips.METHODS``;
            ``skip-norm`` normalises each skip with a GroupNorm of ``norm_groups`` groups (the
            backbone's own normalisation) before the concatenation. ``merge-norm`` and ``cs-init``
            are refused: the decoder block takes the concatenation itself, with no merge layer of
            its own.
        kappa: base of ``cs``: skip i (1 = outermost) is scaled by ``kappa ** (i - 1)``.
        ls_reduction: squeeze-excitation reduction r of the ``ls-nonshare`` channel gates.
    """

    def __init__(
        self,
        img_size: int = 32,
        in_channels: int = 3,
        base_channels: int = 128,
        channel_mult: tuple[int, ...] | list[int] = (1, 2, 2, 2),
        num_res_blocks: int = 2,
        attn_resolutions: tuple[int, ...] | list[int] = (16,),
        attn_heads: int = 1,
        dropout: float = 0.1,
        num_classes: int = 0,
        norm_groups: int = 32,
        skip_method: str = "none",
        kappa: float = DEFAULT_KAPPA["unet"],
        ls_reduction: int = 16,
    ):
        super().__init__()
        problem = layout_problem(img_size, channel_mult, num_res_blocks, base_channels, attn_heads)
        if problem is not None:
            raise ScaleLongError(problem)
        levels = len(channel_mult)
        self.img_size, self.in_channels, self.num_classes = img_size, in_channels, num_classes
        self.base_channels = base_channels
        emb_dim = 4 * base_channels
        self.time_embed = nn.Sequential(
            nn.Linear(base_channels, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim)
        )
        self.label_emb = nn.Embedding(num_classes, emb_dim) if num_classes > 0 else None

        def unit(cin: int, cout: int, res: int) -> Level:
            attn = AttnBlock(cout, attn_heads, norm_groups) if res in attn_resolutions else None
            return Level(ResBlock(cin, cout, emb_dim, dropout, norm_groups), attn)

        self.conv_in = nn.Conv2d(in_channels, base_channels, 3, padding=1)
        self.down = nn.ModuleList()
        ch, res = base_channels, img_size
        self.skip_layout = [(ch, res)]  # (channels, side) of every skip, outermost first
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                self.down.append(unit(ch, base_channels * mult, res))
                ch = base_channels * mult
                self.skip_layout.append((ch, res))
            if level < levels - 1:
                self.down.append(Downsample(ch))
                res //= 2
                self.skip_layout.append((ch, res))

        # res + attention, res: attention in the middle always, as in DDPM and ADM
        self.mid = nn.ModuleList(
            [
                Level(
                    ResBlock(ch, ch, emb_dim, dropout, norm_groups), AttnBlock(ch, attn_heads, norm_groups)
                ),
                ResBlock(ch, ch, emb_dim, dropout, norm_groups),
            ]
        )

        self.up = nn.ModuleList()
        skip_ch = [c for c, _ in self.skip_layout]
        stack = list(skip_ch)
        for level, mult in reversed(list(enumerate(channel_mult))):
            for _ in range(num_res_blocks + 1):
                self.up.append(unit(ch + stack.pop(), base_channels * mult, res))
                ch = base_channels * mult
            if level > 0:
                self.up.append(Upsample(ch))
                res *= 2
        self.norm_out = norm(ch, norm_groups)
        self.conv_out = nn.Conv2d(ch, in_channels, 3, padding=1)

        self.skip_scaling = SkipScaling(
            skip_method,
            len(skip_ch),
            kappa,
            reduction=ls_reduction,
            skip_channels=skip_ch,
            norm_groups=norm_groups,
        )

    @property
    def num_skips(self) -> int:
        return len(self.skip_layout)

    def skip_shapes(self, batch_size: int = 1) -> list[tuple[int, ...]]:
        """Shape of every long skip, outermost first."""
        return [(batch_size, c, r, r) for c, r in self.skip_layout]

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        emb = self.time_embed(timestep_embedding(t, self.base_channels).to(x.dtype))
        if self.label_emb is not None:
            if y is None:
                raise ScaleLongError("this UNet is class-conditional: pass labels y")
            emb = emb + self.label_emb(y)
        elif y is not None:
            raise ScaleLongError(
                "this UNet is not class-conditional (num_classes=0): it takes no labels y; "
                "build it with num_classes > 0 to condition on labels"
            )
        emb = F.silu(emb)  # (B, 4 * base); every block applies SiLU first, so do it once

        h = self.conv_in(x)
        skips = [h]
        for block in self.down:
            h = block(h, emb)
            skips.append(h)
        h = self.mid[1](self.mid[0](h, emb), emb)
        for block in self.up:
            if isinstance(block, Upsample):
                h = block(h)
            else:
                index = len(skips)  # innermost skip first: N, N-1, ..., 1
                h = block(torch.cat([h, self.skip_scaling(skips.pop(), index)], dim=1), emb)
        return self.conv_out(F.silu(self.norm_out(h)))
