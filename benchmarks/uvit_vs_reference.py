"""Our U-ViT against a plain reference U-ViT of the same network, with no scaling hooks at all.

The reference below is a straightforward transformer written from the U-ViT description
(patch-embedding conv, a time token, learned positions, pre-LN blocks, ``Linear(2D -> D)`` on
``cat[x, skip]`` in every out-block, LayerNorm, Linear, unpatchify, 3x3 conv); attention is
``F.scaled_dot_product_attention``, which is what the release runs on PyTorch 2. It shares
our parameter names, so our weights are copied over and the outputs must agree exactly.
Training steps are timed in alternation. Goal: ours (method none) <= 1.0x the reference.

    python -m benchmarks.uvit_vs_reference            # U-ViT-S/2, batch 8
    python -m benchmarks.uvit_vs_reference --quick    # D=128, patch 4, batch 8
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.harness import (
    add_common_args,
    interleaved_medians,
    markdown_table,
    noise_floor,
    ratios,
    result_name,
    setup,
    training_step,
    write_result,
)
from benchmarks.method_overhead import uvit


class RefBlock(nn.Module):
    def __init__(self, d: int, heads: int, skip: bool):
        super().__init__()
        self.heads = heads
        self.skip_linear = nn.Linear(2 * d, d) if skip else None
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        if self.skip_linear is not None:
            x = self.skip_linear(torch.cat([x, skip], dim=-1))
        B, L, D = x.shape
        q, k, v = self.attn.qkv(self.norm1(x)).reshape(B, L, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, D)
        x = x + self.attn.proj(a)
        return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(x))))


class RefUViT(nn.Module):
    """Unconditional U-ViT, no skip scaling: the in-block outputs go straight into the merges."""

    def __init__(self, img: int, patch: int, ch: int, d: int, depth: int, heads: int):
        super().__init__()
        self.img, self.patch, self.ch, self.d = img, patch, ch, d
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(ch, d, patch, stride=patch)
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + (img // patch) ** 2, d))
        self.in_blocks = nn.ModuleList(RefBlock(d, heads, False) for _ in range(depth // 2))
        self.mid_block = RefBlock(d, heads, False)
        self.out_blocks = nn.ModuleList(RefBlock(d, heads, True) for _ in range(depth // 2))
        self.norm = nn.LayerNorm(d)
        self.decoder_pred = nn.Linear(d, patch * patch * ch)
        self.final_layer = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        half = self.d // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
        args = t.float()[:, None] * freqs[None]
        time_token = torch.cat([torch.cos(args), torch.sin(args)], dim=-1).unsqueeze(1)
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([time_token.to(x.dtype), x], dim=1) + self.pos_embed
        skips = []
        for blk in self.in_blocks:
            x = blk(x)
            skips.append(x)
        x = self.mid_block(x)
        for blk in self.out_blocks:
            x = blk(x, skips.pop())
        x = self.decoder_pred(self.norm(x))[:, 1:]
        h = self.img // self.patch
        x = x.reshape(-1, h, h, self.patch, self.patch, self.ch)
        x = torch.einsum("bhwpqc->bchpwq", x).reshape(-1, self.ch, self.img, self.img)
        return self.final_layer(x)


def reference_of(model: nn.Module) -> RefUViT:
    """A reference U-ViT holding a copy of ``model``'s backbone weights."""
    blk = model.in_blocks[0]
    ref = RefUViT(
        model.img_size, model.patch_size, model.in_channels, model.embed_dim,
        2 * model.num_skips, blk.attn.num_heads,
    )  # fmt: skip
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("skip_scaling.")}
    ref.load_state_dict(state)  # strict: every reference parameter has its counterpart
    return ref


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args(argv)
    device = setup(args)
    repeats = args.repeats or (9 if args.quick else 5)

    ours, ours_cs = uvit("none", args.quick), uvit("cs", args.quick)
    ref, ref2 = reference_of(ours), reference_of(ours)
    x, t = torch.randn(2, 3, 32, 32), torch.rand(2) * 999
    with torch.no_grad():
        diff = (ours.eval()(x, t) - ref.eval()(x, t)).abs().max().item()
    print(f"ours vs reference, max |output difference|: {diff:.2e}")
    models = {"reference": ref, "reference (again)": ref2, "ours, none": ours, "ours, cs": ours_cs}
    fns = {name: training_step(m, args.batch, device=device) for name, m in models.items()}
    med = interleaved_medians(fns, repeats=repeats, warmup=1, device=device)
    rel = ratios(med, "reference")
    goal = {"ours, none": 1.0}
    rows = [
        [name, f"{med[name] * 1e3:.1f}", f"{rel[name]:.3f}", f"<= {goal[name]}" if name in goal else "",
         ("yes" if rel[name] <= goal[name] else "no") if name in goal else ""]
        for name in models
    ]  # fmt: skip
    floor = noise_floor(med, "reference", "reference (again)")
    table = markdown_table(["model", "step ms (median)", "ratio to reference", "goal", "met"], rows)
    note = (
        f"\n\nU-ViT D={ours.embed_dim}, patch {ours.patch_size}, {ours.num_tokens} tokens, training step "
        f"(fwd + bwd + AdamW) at batch {args.batch}, {device.type}, {torch.get_num_threads()} thread(s), "
        f"{repeats} interleaved repeats; outputs agree to {diff:.1e}; noise floor +-{100 * floor:.1f}%.\n"
    )
    print(table + note)
    write_result(
        result_name("uvit_vs_reference", device, args.quick),
        {"args": vars(args), "device": device.type, "median_s": med, "ratio": rel, "noise_floor": floor,
         "max_abs_diff": diff},
        table + note,
    )  # fmt: skip


if __name__ == "__main__":
    main()
