"""Our UNet vs diffusers' UNet2DModel, both built as the DDPM CIFAR-10 network.

One training step (forward, epsilon MSE, backward, AdamW) at a small batch, the two models
timed in alternation; reports the step-time ratio ours / diffusers and both parameter counts.

    python -m benchmarks.unet_vs_diffusers            # DDPM CIFAR-10 size, batch 8
    python -m benchmarks.unet_vs_diffusers --quick    # a quarter of the width, 2 repeats
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from benchmarks.harness import interleaved_medians, markdown_table, ratios, write_result
from scalelong.models.unet import UNet


def diffusers_ddpm(base: int, dropout: float = 0.1) -> nn.Module:
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(base, 2 * base, 2 * base, 2 * base),
        layers_per_block=2,
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=None,  # one head, as DDPM
        flip_sin_to_cos=False,  # sin half first, as DDPM
        norm_eps=1e-6,
        dropout=dropout,
    )


class Tensorised(nn.Module):
    """diffusers returns an output object; the step needs the tensor."""

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.unet(x, t, return_dict=False)[0]


def train_step_fn(model: nn.Module, batch: int, channels_last: bool = False):
    """A closure running one full training step on fixed random data."""
    gen = torch.Generator().manual_seed(0)
    x, noise = torch.randn(batch, 3, 32, 32, generator=gen), torch.randn(batch, 3, 32, 32, generator=gen)
    t = torch.randint(0, 1000, (batch,), generator=gen).float()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x, noise = (
            x.contiguous(memory_format=torch.channels_last),
            noise.contiguous(memory_format=torch.channels_last),
        )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step() -> None:
        loss = (model(x, t) - noise).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="base width 32, 2 repeats")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="CPU threads (the machine is shared)")
    p.add_argument("--channels-last", action="store_true", help="also time our UNet in channels_last")
    args = p.parse_args()
    base = 32 if args.quick else 128
    repeats = 2 if args.quick else args.repeats
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ours = UNet(base_channels=base, skip_method="none")
    theirs = Tensorised(diffusers_ddpm(base))
    fns = {
        "diffusers UNet2DModel": train_step_fn(theirs, args.batch),
        "ours (UNet)": train_step_fn(ours, args.batch),
    }
    if args.channels_last:
        torch.manual_seed(0)
        fns["ours, channels_last"] = train_step_fn(UNet(base_channels=base), args.batch, channels_last=True)
    med = interleaved_medians(fns, repeats=repeats, warmup=1)
    rel = ratios(med, "diffusers UNet2DModel")
    params = {"diffusers UNet2DModel": count(theirs), "ours (UNet)": count(ours)}
    params["ours, channels_last"] = count(ours)
    rows = [[name, f"{params[name]:,}", f"{med[name] * 1000:.0f}", f"{rel[name]:.3f}"] for name in fns]
    table = markdown_table(["model", "parameters", "step ms (median)", "ratio to diffusers"], rows)
    note = (
        f"\n\nDDPM CIFAR-10 architecture (base {base}, mult 1,2,2,2, 2 res blocks, attention at 16x16), "
        f"training step (fwd + bwd + AdamW) at batch {args.batch}, CPU, {args.threads} thread(s), "
        f"{repeats} interleaved repeats. Goal: ours <= 0.9x.\n"
    )
    print(table + note)
    write_result(
        "unet_vs_diffusers_quick" if args.quick else "unet_vs_diffusers",
        {"args": vars(args), "median_s": med, "ratio": rel, "parameters": params},
        table + note,
    )


if __name__ == "__main__":
    main()
