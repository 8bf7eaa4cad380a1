"""Networks for the find_skips tests, written for them (no third-party code).

:class:`EDM2LikeUNet` follows the structure of the UNet of EDM2 (Karras et al., "Analyzing and
Improving the Training Dynamics of Diffusion Models", CVPR 2024), as read off the released network
(``training.networks_edm2.UNet``) with hooks of the tests' kind: magnitude-preserving layers; a
``forward(x, noise_labels, class_labels)``; an encoder of named blocks in a ``ModuleDict``
(``{res}x{res}_conv``, ``_down``, ``_block{i}``) whose every output, the first conv's too, is
pushed on a list; self-attention inside the blocks of the listed resolutions; a decoder
(``_in0``, ``_in1``, ``_up``, ``_block{i}``) that, before each block named ``block``, concatenates
the popped skip in the UNet's own forward with a magnitude-preserving concat (both operands
scaled, then ``torch.cat([x, skip])``: the skip is the tail). So ``channel_mult=(1, 2)``,
``num_blocks=1`` has the released network's 4 skips of widths [16, 16, 16, 32], merged by
``dec.8x8_block1``, ``dec.8x8_block0``, ``dec.4x4_block1``, ``dec.4x4_block0`` (outermost first),
each the tail slice of its input. Names, widths and call pattern are what matter to the tests;
the arithmetic is this file's own. Unlike the released network, whose ``out_gain`` starts at 0
(its output is 0 at initialisation), the output gain here starts at 1, so outputs can be compared.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def normalize(x: torch.Tensor, dim=None, eps: float = 1e-4) -> torch.Tensor:
    dim = list(range(1, x.ndim)) if dim is None else dim
    norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True, dtype=torch.float32)
    return x / (eps + norm * math.sqrt(norm.numel() / x.numel())).to(x.dtype)


def mp_silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x) / 0.596


def mp_sum(a: torch.Tensor, b: torch.Tensor, t: float = 0.5) -> torch.Tensor:
    return a.lerp(b, t) / math.sqrt((1 - t) ** 2 + t**2)


def mp_cat(a: torch.Tensor, b: torch.Tensor, t: float = 0.5) -> torch.Tensor:
    """Concatenate along channels, each operand weighted so the result keeps unit magnitude."""
    na, nb = a.shape[1], b.shape[1]
    c = math.sqrt((na + nb) / ((1 - t) ** 2 + t**2))
    return torch.cat([(c / math.sqrt(na) * (1 - t)) * a, (c / math.sqrt(nb) * t) * b], dim=1)


class MPConv(nn.Module):
    """A convolution (or a linear layer, kernel ()) with unit-norm weights."""

    def __init__(self, cin: int, cout: int, kernel: tuple[int, ...]):
        super().__init__()
        self.out_channels = cout
        self.weight = nn.Parameter(torch.randn(cout, cin, *kernel))

    def forward(self, x: torch.Tensor, gain: float | torch.Tensor = 1.0) -> torch.Tensor:
        w = normalize(self.weight) * (gain / math.sqrt(self.weight[0].numel()))
        if w.ndim == 2:
            return x @ w.t()
        return F.conv2d(x, w, padding=w.shape[-1] // 2)


class Block(nn.Module):
    """An encoder ('enc') or decoder ('dec') block: optional resampling, a residual pair of
    convolutions modulated by the embedding, a magnitude-preserving sum."""

    def __init__(self, cin: int, cout: int, cemb: int, flavor: str = "enc", resample: str = "keep",
                 attention: bool = False):  # fmt: skip
        super().__init__()
        self.out_channels, self.flavor, self.resample = cout, flavor, resample
        self.emb_gain = nn.Parameter(torch.zeros([]))
        self.conv_res0 = MPConv(cout if flavor == "enc" else cin, cout, (3, 3))
        self.emb_linear = MPConv(cemb, cout, ())
        self.conv_res1 = MPConv(cout, cout, (3, 3))
        self.conv_skip = MPConv(cin, cout, (1, 1)) if cin != cout else None
        self.attn_qkv = MPConv(cout, cout * 3, (1, 1)) if attention else None
        self.attn_proj = MPConv(cout, cout, (1, 1)) if attention else None

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        if self.resample == "down":
            x = F.avg_pool2d(x, 2)
        elif self.resample == "up":
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        if self.flavor == "enc":
            if self.conv_skip is not None:
                x = self.conv_skip(x)
            x = normalize(x, dim=1)
        y = self.conv_res0(mp_silu(x))
        c = self.emb_linear(emb, gain=self.emb_gain) + 1
        y = self.conv_res1(mp_silu(y * c[:, :, None, None]))
        if self.flavor == "dec" and self.conv_skip is not None:
            x = self.conv_skip(x)
        x = mp_sum(x, y, t=0.3)
        if self.attn_qkv is not None:  # one head over the pixels
            q, k, v = normalize(self.attn_qkv(x).flatten(2), dim=1).chunk(3, dim=1)
            w = torch.einsum("ncq,nck->nqk", q, k / math.sqrt(q.shape[1])).softmax(dim=2)
            x = mp_sum(x, self.attn_proj(torch.einsum("nqk,nck->ncq", w, v).reshape(x.shape)), t=0.3)
        return x.clip_(-256, 256)


class EDM2LikeUNet(nn.Module):
    """``forward(x, noise_labels, class_labels=None)``; with the defaults 4 skips of widths
    [16, 16, 16, 32], attention in the 4x4 blocks."""

    def __init__(self, img_resolution: int = 8, img_channels: int = 1, label_dim: int = 0,
                 model_channels: int = 16, channel_mult: tuple[int, ...] = (1, 2), num_blocks: int = 1,
                 attn_resolutions: tuple[int, ...] = (4,)):  # fmt: skip
        super().__init__()
        cblock = [model_channels * m for m in channel_mult]
        cemb = max(cblock)
        self.out_gain = nn.Parameter(torch.ones([]))
        self.register_buffer("freqs", torch.randn(cblock[0]))
        self.emb_noise = MPConv(cblock[0], cemb, ())
        self.emb_label = MPConv(label_dim, cemb, ()) if label_dim else None
        self.enc = nn.ModuleDict()
        cout = img_channels + 1
        for level, channels in enumerate(cblock):
            res = img_resolution >> level
            if level == 0:
                self.enc[f"{res}x{res}_conv"] = MPConv(cout, channels, (3, 3))
                cout = channels
            else:
                self.enc[f"{res}x{res}_down"] = Block(cout, cout, cemb, "enc", "down")
            for idx in range(num_blocks):
                attn = res in attn_resolutions
                self.enc[f"{res}x{res}_block{idx}"] = Block(cout, channels, cemb, "enc", attention=attn)
                cout = channels
        self.skip_widths = [block.out_channels for block in self.enc.values()]
        self.dec = nn.ModuleDict()
        skips = list(self.skip_widths)
        for level, channels in reversed(list(enumerate(cblock))):
            res = img_resolution >> level
            if level == len(cblock) - 1:
                self.dec[f"{res}x{res}_in0"] = Block(cout, cout, cemb, "dec", attention=True)
                self.dec[f"{res}x{res}_in1"] = Block(cout, cout, cemb, "dec")
            else:
                self.dec[f"{res}x{res}_up"] = Block(cout, cout, cemb, "dec", "up")
            for idx in range(num_blocks + 1):
                attn = res in attn_resolutions
                self.dec[f"{res}x{res}_block{idx}"] = Block(
                    cout + skips.pop(), channels, cemb, "dec", attention=attn
                )
                cout = channels
        self.out_conv = MPConv(cout, img_channels, (3, 3))

    def forward(self, x: torch.Tensor, noise_labels: torch.Tensor, class_labels=None) -> torch.Tensor:
        emb = self.emb_noise(torch.cos(noise_labels[:, None] * self.freqs) * math.sqrt(2))
        if self.emb_label is not None:
            emb = mp_sum(emb, self.emb_label(class_labels * math.sqrt(class_labels.shape[1])), t=0.5)
        emb = mp_silu(emb)
        x = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)
        skips = []
        for name, block in self.enc.items():
            x = block(x) if "conv" in name else block(x, emb)
            skips.append(x)
        for name, block in self.dec.items():
            if "block" in name:
                x = mp_cat(x, skips.pop())
            x = block(x, emb)
        return self.out_conv(x, gain=self.out_gain)


def edm2_like() -> EDM2LikeUNet:
    torch.manual_seed(0)
    return EDM2LikeUNet().eval()


def edm2_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(2, 1, 8, 8, generator=gen), torch.tensor([0.3, -1.2])


def edm2_producers(net: EDM2LikeUNet, record: list) -> None:
    """Every encoder entry's output, in forward order: what the UNet pushes on its list."""
    for block in net.enc.values():
        block.register_forward_hook(lambda _m, _a, out: record.append(out))


def edm2_consumers(net: EDM2LikeUNet, record: list) -> None:
    """The concatenated input of every decoder block that takes a skip (its 1x1 shortcut sees it
    whole); mp_cat scales both operands, so the tests compare it with the produced skip up to a
    factor."""
    for name, block in net.dec.items():
        if "block" in name:
            block.conv_skip.register_forward_pre_hook(lambda _m, args: record.append((args[0], 1)))


def edm2_declaration(net: nn.Module) -> list:
    """The recipe of docs/own-loop.md for an EDM2-style UNet, by module paths: every entry of
    ``net.enc`` is a skip (the first conv's too), and the decoder blocks named ``block`` merge
    them in reverse, each as the tail of its input."""
    from scalelong import SkipInput

    widths = [block.out_channels for block in net.enc.values()]  # skip 1 first: the conv's output
    merging = [name for name in net.dec if "block" in name]  # decoder order: innermost skip first
    return [SkipInput(f"dec.{n}", 0, slice(-w, None)) for n, w in zip(reversed(merging), widths, strict=True)]


def edm2_hand_declaration(net: EDM2LikeUNet) -> list:
    """What a user writes for it by hand: skip i, outermost first, is the tail slice of the input
    of the i-th decoder block from the end."""
    from scalelong.adapters import SkipInput

    merging = [b for name, b in net.dec.items() if "block" in name]
    return [SkipInput(b, 0, slice(-w, None)) for b, w in zip(reversed(merging), net.skip_widths, strict=True)]
