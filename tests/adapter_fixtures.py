"""Toy backbones for the adapter tests, each with probes that read its skips off the real model.

A :class:`Case` knows, independently of the adapter under test, which tensors the model makes
as skips (``producers``: forward hooks, in forward order, so the first is the outermost) and
which tensors carry a skip into the decoder (``consumers``: the concatenated input of the layer
that merges it, and the concatenation axis). The tests match each merged skip to the produced
skip it is a multiple of, so no test assumes the index mapping the adapter implements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from scalelong.adapters import SkipInput

Record = list  # appended to by the probes


@dataclass
class Case:
    build: Callable[[], nn.Module]
    run: Callable[[nn.Module], torch.Tensor]
    producers: Callable[[nn.Module, Record], None]  # appends every produced skip, in forward order
    consumers: Callable[[nn.Module, Record], None]  # appends (merged input, concat dim) per merge
    num_skips: int
    blocks: list[str]
    declare: Callable[[nn.Module], dict] = field(default=lambda model: {})  # extra apply_scalelong kwargs
    watch: Callable[[nn.Module], dict] | None = None  # blocks a user declares for the diagnostics
    shapes: list | None = None  # what describe() reports per skip (without the batch), outermost first


def _append_output(record: Record) -> Callable:
    return lambda _m, _a, out: record.append(out)


def _append_input(record: Record, dim: int) -> Callable:
    return lambda _m, args: record.append((args[0], dim))


# ----------------------------------------------------------------------------- diffusers U-ViT


def utransformer() -> nn.Module:
    from diffusers.pipelines.deprecated.unidiffuser.modeling_uvit import UTransformer2DModel

    torch.manual_seed(0)
    # 7 layers: 3 in-blocks, a mid block, 3 out-blocks; 16 patch tokens of width 16 = 2 * 2 * 4
    return UTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        num_layers=7,
        sample_size=8,
        patch_size=2,
    ).eval()


def run_utransformer(model: nn.Module) -> torch.Tensor:
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    return model(x).sample


def _uvit_producers(transformer: nn.Module, record: Record) -> None:
    for block in transformer.transformer_in_blocks:
        block.register_forward_hook(_append_output(record))


def _uvit_consumers(transformer: nn.Module, record: Record) -> None:
    # SkipBlock: skip_linear(cat([x, skip], -1)); its Linear sees the merged tokens
    for out_block in transformer.transformer_out_blocks:
        out_block["skip"].skip_linear.register_forward_pre_hook(_append_input(record, -1))


def unidiffuser(data_type: bool = True) -> nn.Module:
    from diffusers.pipelines.deprecated.unidiffuser.modeling_uvit import UniDiffuserModel

    torch.manual_seed(0)
    # tokens: 2 timesteps + 3 text + 1 CLIP image + 1 data type + 16 patches = 23
    return UniDiffuserModel(
        text_dim=8,
        clip_img_dim=8,
        num_text_tokens=3,
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        num_layers=5,
        sample_size=8,
        patch_size=2,
        use_data_type_embedding=data_type,
    ).eval()


def run_unidiffuser(model: nn.Module) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    latent, image, text = (torch.randn(*s, generator=gen) for s in ((2, 4, 8, 8), (2, 1, 8), (2, 3, 8)))
    outs = model(latent, image, text, torch.tensor([10, 500]), torch.tensor([0, 900]))
    return torch.cat([o.flatten(1) for o in outs], dim=1)


# ----------------------------------------------------------------------------- diffusers UNets


def unet2d() -> nn.Module:
    """A toy diffusers UNet2DModel: 16x16 grey images, two levels, 4 skips; the same weights each call."""
    import diffusers

    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=16,
        in_channels=1,
        out_channels=1,
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
        attention_head_dim=8,
    )


# The same toy UNet2DModel as `scalelong train` overrides (model.type=diffusers_unet2d, method ls).
TOY_DIFFUSERS_OVERRIDES = [
    "model.type=diffusers_unet2d",
    "model.skip.method=ls",
    "model.diffusers_unet2d.in_channels=1",
    "model.diffusers_unet2d.block_out_channels=[16,32]",
    "model.diffusers_unet2d.layers_per_block=1",
    "model.diffusers_unet2d.down_block_types=[DownBlock2D,AttnDownBlock2D]",
    "model.diffusers_unet2d.up_block_types=[AttnUpBlock2D,UpBlock2D]",
    "model.diffusers_unet2d.norm_num_groups=8",
]


def unet2d_condition() -> nn.Module:
    """A toy diffusers UNet2DConditionModel with cross-attention on 8-wide context tokens."""
    import diffusers

    torch.manual_seed(0)
    return diffusers.UNet2DConditionModel(
        sample_size=16,
        in_channels=1,
        out_channels=1,
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=8,
        attention_head_dim=4,
        norm_num_groups=8,
    )


def run_unet2d(model: nn.Module) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1, 16, 16, generator=gen)
    return model(x, torch.tensor([10.0, 500.0])).sample


def run_unet2d_condition(model: nn.Module) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x, text = torch.randn(2, 1, 16, 16, generator=gen), torch.randn(2, 5, 8, generator=gen)
    return model(x, torch.tensor([10.0, 500.0]), encoder_hidden_states=text).sample


def _unet_producers(unet: nn.Module, record: Record) -> None:
    unet.conv_in.register_forward_hook(_append_output(record))  # skip 1: conv_in's output

    def down(_m, _a, out):  # a down block returns (hidden, res_samples): its skips, in order
        record.extend(out[1])

    for block in unet.down_blocks:
        block.register_forward_hook(down)


def _unet_consumers(unet: nn.Module, record: Record) -> None:
    # every up resnet sees cat([h, skip], 1) after every pre-hook of its up block
    for block in unet.up_blocks:
        for resnet in block.resnets:
            resnet.register_forward_pre_hook(_append_input(record, 1))


# ----------------------------------------------------------------------------- denoising-diffusion-pytorch


def ddpm_unet() -> nn.Module:
    from denoising_diffusion_pytorch import Unet

    torch.manual_seed(0)
    # dims [4, 8, 16, 32]; skips: r (4), then 2 per level of widths 4, 8, 16: N = 7
    return Unet(dim=8, init_dim=4, dim_mults=(1, 2, 4), channels=1, attn_dim_head=4, attn_heads=1).eval()


def run_ddpm(model: nn.Module) -> torch.Tensor:
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    return model(x, torch.tensor([3.0, 700.0]))


def _ddpm_producers(unet: nn.Module, record: Record) -> None:
    unet.init_conv.register_forward_hook(_append_output(record))  # r = init_conv(x).clone()
    for block1, _block2, _attn, downsample in unet.downs:
        block1.register_forward_hook(_append_output(record))  # h.append(block1(x, t))
        # h.append(attn(x) + x) is what the level's downsample receives next
        downsample.register_forward_pre_hook(lambda _m, args: record.append(args[0]))


def _ddpm_consumers(unet: nn.Module, record: Record) -> None:
    # a merging ResnetBlock's first conv sees cat((x, skip), 1) after every pre-hook of the block
    merging = [b for up in unet.ups for b in up[:2]] + [unet.final_res_block]
    for block in merging:
        block.block1.proj.register_forward_pre_hook(_append_input(record, 1))


# ----------------------------------------------------------------------------- a network of one's own


class Merge(nn.Module):
    """A decoder block that takes its skip as a keyword argument."""

    def __init__(self, c_x: int, c_skip: int, c_out: int):
        super().__init__()
        self.conv = nn.Conv2d(c_x + c_skip, c_out, 3, padding=1)

    def forward(self, x: torch.Tensor, *, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([x, skip], dim=1))


class TinyUNet(nn.Module):
    """Two skips merged two ways: by keyword into a block, and concatenated in this forward (EDM style)."""

    def __init__(self):
        super().__init__()
        self.enc0 = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.SiLU())  # skip 1: 4 x 8 x 8
        self.enc1 = nn.Sequential(nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.SiLU())  # skip 2: 8 x 4 x 4
        self.mid = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.SiLU())
        self.dec1 = Merge(8, 8, 4)
        self.up = nn.Upsample(scale_factor=2)
        self.dec0 = nn.Conv2d(4 + 4, 1, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.enc0(x)
        s2 = self.enc1(s1)
        h = self.dec1(self.mid(s2), skip=s2)
        return self.dec0(torch.cat([self.up(h), s1], dim=1))


def tiny_unet() -> nn.Module:
    torch.manual_seed(0)
    return TinyUNet().eval()


def run_tiny(model: nn.Module) -> torch.Tensor:
    return model(torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0)))


def declare_tiny(net: nn.Module) -> dict:
    skips = [SkipInput(net.dec0, arg=0, channels=slice(-4, None)), SkipInput(net.dec1, arg="skip")]
    return {"skips": skips, "skip_channels": [4, 8]}


def _tiny_producers(net: nn.Module, record: Record) -> None:
    net.enc0.register_forward_hook(_append_output(record))
    net.enc1.register_forward_hook(_append_output(record))


def _tiny_consumers(net: nn.Module, record: Record) -> None:
    net.dec1.conv.register_forward_pre_hook(_append_input(record, 1))
    net.dec0.register_forward_pre_hook(_append_input(record, 1))  # after the adapter's own pre-hook


# ----------------------------------------------------------------------------- the cases

_UVIT_BLOCKS = [f"transformer_in_blocks.{k}" for k in range(3)] + ["transformer_mid_block"]
_UVIT_BLOCKS += [f"transformer_out_blocks.{k}.block" for k in range(3)]
_UNIDIFFUSER_BLOCKS = [f"transformer.transformer_in_blocks.{k}" for k in range(2)]
_UNIDIFFUSER_BLOCKS += ["transformer.transformer_mid_block"]
_UNIDIFFUSER_BLOCKS += [f"transformer.transformer_out_blocks.{k}.block" for k in range(2)]
_DDPM_BLOCKS = [f"downs.{lv}.{b}" for lv in range(3) for b in (0, 1)] + ["mid_block1", "mid_block2"]
_DDPM_BLOCKS += [f"ups.{lv}.{b}" for lv in range(3) for b in (0, 1)] + ["final_res_block"]

_UNET_BLOCKS = ["down_blocks.0", "down_blocks.1", "mid_block", "up_blocks.0", "up_blocks.1"]
_UNET_SHAPES = [(16, 16, 16), (16, 16, 16), (16, 8, 8), (32, 8, 8)]  # conv_in, resnet, downsample, resnet

CASES = {
    "UNet2DModel": Case(
        lambda: unet2d().eval(),
        run_unet2d,
        _unet_producers,
        _unet_consumers,
        4,
        _UNET_BLOCKS,
        shapes=_UNET_SHAPES,
    ),
    "UNet2DConditionModel": Case(
        lambda: unet2d_condition().eval(),
        run_unet2d_condition,
        _unet_producers,
        _unet_consumers,
        4,
        _UNET_BLOCKS,
        shapes=_UNET_SHAPES,
    ),
    "UTransformer2DModel": Case(
        utransformer,
        run_utransformer,
        _uvit_producers,
        _uvit_consumers,
        3,
        _UVIT_BLOCKS,
        shapes=[(16, 16)] * 3,  # 16 patch tokens of width 2 heads x 8
    ),
    "UniDiffuserModel": Case(
        unidiffuser,
        run_unidiffuser,
        lambda m, r: _uvit_producers(m.transformer, r),
        lambda m, r: _uvit_consumers(m.transformer, r),
        2,
        _UNIDIFFUSER_BLOCKS,
        shapes=[(23, 16)] * 2,  # the whole sequence the transformer sees
    ),
    "ddpm-Unet": Case(
        ddpm_unet,
        run_ddpm,
        _ddpm_producers,
        _ddpm_consumers,
        7,
        _DDPM_BLOCKS,
        shapes=[(w, None, None) for w in (4, 4, 4, 8, 8, 16, 16)],  # its sides follow the input's
    ),
    "declared": Case(
        tiny_unet,
        run_tiny,
        _tiny_producers,
        _tiny_consumers,
        2,
        ["enc0", "enc1", "mid", "dec1", "dec0"],
        declare_tiny,
        lambda net: {name: getattr(net, name) for name in ("enc0", "enc1", "mid", "dec1", "dec0")},
        shapes=[(4, None, None), (8, None, None)],  # what skip_channels says
    ),
}
NEEDS = {  # the optional package each case's model comes from
    "UNet2DModel": "diffusers",
    "UNet2DConditionModel": "diffusers",
    "UTransformer2DModel": "diffusers",
    "UniDiffuserModel": "diffusers",
    "ddpm-Unet": "denoising_diffusion_pytorch",
    "declared": None,
}


def case_params() -> list:
    marks = {name: () for name in CASES}
    for name, package in NEEDS.items():
        if package is not None:
            try:
                __import__(package)
            except ImportError:
                marks[name] = (pytest.mark.skip(reason=f"needs {package}"),)
    return [pytest.param(name, marks=marks[name], id=name) for name in CASES]
