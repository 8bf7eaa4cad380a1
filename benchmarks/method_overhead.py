"""What ScaleLong costs: training-step time of every skip method as a ratio to ``none``.

U-ViT and UNet, each built once per method from the same seed (the backbone weights are
identical; only the SkipScaling differs), timed in alternation. ``none (again)`` is a second
copy of the baseline: its ratio is the noise floor of the measurement. For U-ViT, ``cs, fused``
is a candidate fast path: the constant coefficient folded into the merge layer's weight
(``skip_linear(cat[x, c*s]) == F.linear(cat[x, s], W * [1, c])``) instead of scaling the skip.

Goals: ``sqrt2``, ``cs`` <= 1.01x; ``ls``, ``ls-nonshare`` <= 1.03x.

    python -m benchmarks.method_overhead            # U-ViT-S/2 and the DDPM UNet, batch 8
    python -m benchmarks.method_overhead --quick    # D=128 U-ViT and base-32 UNet, batch 8
"""

from __future__ import annotations

import argparse

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
from scalelong.models.unet import UNet
from scalelong.models.uvit import UViT
from scalelong.skips import METHODS, SkipScaling

GOALS = {"sqrt2": 1.01, "cs": 1.01, "ls": 1.03, "ls-nonshare": 1.03, "cs, fused": 1.01}


def uvit(method: str, quick: bool) -> UViT:
    torch.manual_seed(0)
    if quick:  # CIFAR shape, 6 skips, 65 tokens
        return UViT(32, 4, 3, 128, 12, 4, skip_method=method)
    return UViT(skip_method=method)  # U-ViT-S/2: D=512, depth 12, 257 tokens


def unet(method: str, quick: bool) -> UNet:
    torch.manual_seed(0)
    return UNet(base_channels=32 if quick else 128, skip_method=method, kappa=0.9)  # DDPM layout, 12 skips


class FusedMerge(nn.Module):
    """``skip_linear`` with the skip half of its input columns scaled by a constant (a candidate)."""

    def __init__(self, linear: nn.Linear, coef: float):
        super().__init__()
        self.linear = linear
        d = linear.in_features // 2
        self.register_buffer("scale", torch.cat([torch.ones(d), torch.full((d,), coef)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.linear.weight * self.scale, self.linear.bias)


def fuse_cs(model: UViT) -> UViT:
    """Fold the ``cs`` constants into the merge weights and make the SkipScaling a pass-through."""
    coefs = model.skip_scaling.coefficients()
    n = model.num_skips
    for k, blk in enumerate(model.out_blocks):  # out-block k merges skip N - k
        c = coefs[n - k - 1]
        if c != 1.0:
            blk.skip_linear = FusedMerge(blk.skip_linear, c)
    model.skip_scaling = SkipScaling("none", n)
    return model


def check_fused(quick: bool) -> float:
    """Largest |difference| of the fused and the plain cs forward (they must agree)."""
    a, b = uvit("cs", quick).eval(), fuse_cs(uvit("cs", quick)).eval()
    x, t = torch.randn(2, 3, 32, 32), torch.rand(2) * 999
    with torch.no_grad():
        return (a(x, t) - b(x, t)).abs().max().item()


def measure(backbone: str, args, device: torch.device, repeats: int) -> dict:
    build = uvit if backbone == "U-ViT" else unet
    models = {"none": build("none", args.quick), "none (again)": build("none", args.quick)}
    models.update({m: build(m, args.quick) for m in METHODS if m != "none"})
    if backbone == "U-ViT":
        models["cs, fused"] = fuse_cs(build("cs", args.quick))
    amp = torch.bfloat16 if args.bf16 else None
    fns = {name: training_step(m, args.batch, device=device, amp=amp) for name, m in models.items()}
    med = interleaved_medians(fns, repeats=repeats, warmup=1, device=device)
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    return {
        "median_s": med,
        "ratio": ratios(med, "none"),
        "noise_floor": noise_floor(med, "none", "none (again)"),
        "parameters": params,
        "shape": _describe(models["none"]),
    }


def _describe(model: nn.Module) -> str:
    if isinstance(model, UViT):
        return f"U-ViT D={model.embed_dim}, {model.num_skips} skips, {model.num_tokens} tokens"
    return f"UNet base {model.base_channels}, {model.num_skips} skips"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (the GPU recipe's precision)")
    p.add_argument("--backbones", nargs="+", default=["U-ViT", "UNet"], choices=["U-ViT", "UNet"])
    args = p.parse_args(argv)
    device = setup(args)
    repeats = args.repeats or (9 if args.quick else 5)
    print(f"fused cs vs cs, max |diff| of outputs: {check_fused(True):.2e}")

    results, rows = {}, []
    for backbone in args.backbones:
        r = results[backbone] = measure(backbone, args, device, repeats)
        base = r["parameters"]["none"]
        for name, ratio in r["ratio"].items():
            goal = GOALS.get(name)
            met = "" if goal is None else ("yes" if ratio <= goal else "no")
            added = r["parameters"][name] - base
            rows.append(
                [backbone, name, f"{added:,}", f"{r['median_s'][name] * 1e3:.1f}", f"{ratio:.3f}",
                 f"<= {goal}" if goal else "", met]
            )  # fmt: skip
        print(f"{backbone}: noise floor +-{100 * r['noise_floor']:.1f}%", flush=True)
    table = markdown_table(
        ["backbone", "method", "added params", "step ms (median)", "ratio to none", "goal", "met"], rows
    )
    floors = ", ".join(f"{b} +-{100 * r['noise_floor']:.1f}%" for b, r in results.items())
    shapes = "; ".join(f"{b}: {r['shape']}" for b, r in results.items())
    note = (
        f"\n\nTraining step (fwd + bwd + AdamW{', bf16 autocast' if args.bf16 else ''}), batch {args.batch}, "
        f"{device.type}, "
        f"{torch.get_num_threads()} thread(s), {repeats} interleaved repeats. {shapes}. "
        f"Noise floor (none vs an identical copy): {floors}.\n"
    )
    print(table + note)
    name = result_name("method_overhead", device, args.quick, "bf16" if args.bf16 else "")
    write_result(name, {"args": vars(args), "device": device.type, "results": results}, table + note)


if __name__ == "__main__":
    main()
