"""bf16 autocast against fp32 for the U-ViT training step, one width at a time (one process).

    python -m benchmarks.bf16_widths --threads 2          # widths 64, 128, 256, 512, batch 32
    python -m benchmarks.bf16_widths --widths 256 --batch 64

On a CPU with bf16 matrix units the answer flips with the width: small matrices pay autocast's
casts, large ones gain the faster kernels. So ``train.mixed_precision=bf16`` is a per-width
decision, and this table says where it pays on the machine at hand. The U-ViT is the demo's
shape at CIFAR size (depth 12, patch 4, 65 tokens, heads of 64 channels), method cs, timed twice:
plain, and with the demo's depthwise convolution in every MLP (``model.uvit.mlp_conv``), whose
bf16 kernels on a CPU are another matter than those of the matrix products.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.harness import (
    add_common_args,
    interleaved_medians,
    markdown_table,
    ratios,
    result_name,
    setup,
    training_step,
    write_result,
)
from scalelong.models import UViT

BLOCKS = ("plain", "mlp_conv")


def uvit_of_width(width: int, block: str = "plain") -> UViT:
    """U-ViT at CIFAR shape (patch 4, 65 tokens), depth 12 (6 skips), heads of 64 channels;
    ``block`` "mlp_conv": with the demo's depthwise convolution in every MLP."""
    torch.manual_seed(0)
    return UViT(32, 4, 3, width, 12, max(1, width // 64), skip_method="cs", mlp_conv=block == "mlp_conv")


def verdict(ratio: float, tie: float = 0.05) -> str:
    """What the ratio bf16 / fp32 says about ``train.mixed_precision=bf16`` at that width."""
    if ratio < 1 - tie:
        return "bf16 faster"
    if ratio > 1 + tie:
        return "fp32 faster"
    return "tie"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, threads=2)
    p.add_argument(
        "--widths", default="", help="comma-separated widths (default 64,128,256,512; --quick 64,128)"
    )
    p.add_argument("--batch", type=int, default=0, help="batch size (default 32; --quick 8)")
    args = p.parse_args(argv)
    device = setup(args)
    text = args.widths or ("64,128" if args.quick else "64,128,256,512")
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        p.error(f"--widths {text!r}: give comma-separated integers, e.g. 64,256")
    batch = args.batch or (8 if args.quick else 32)
    repeats = args.repeats or (3 if args.quick else 5)
    res: dict[str, dict] = {}
    for width in widths:
        for block in BLOCKS:
            fns = {
                "fp32": training_step(uvit_of_width(width, block), batch, device=device),
                "bf16": training_step(uvit_of_width(width, block), batch, device=device, amp=torch.bfloat16),
            }
            med = interleaved_medians(fns, repeats=repeats, warmup=1, device=device)
            ratio = ratios(med, "fp32")["bf16"]
            res[f"{width} {block}"] = {
                "width": width, "block": block, "median_s": med, "ratio": ratio, "verdict": verdict(ratio)
            }  # fmt: skip
            print(f"width {width}, {block}: bf16 / fp32 {ratio:.3f}", flush=True)
    rows = [
        [r["width"], r["block"], *(f"{r['median_s'][k] * 1e3:.1f}" for k in ("fp32", "bf16")),
         f"{r['ratio']:.3f}", r["verdict"]]
        for r in res.values()
    ]  # fmt: skip
    table = markdown_table(["width", "block", "fp32 ms", "bf16 ms", "bf16 / fp32", "verdict"], rows)
    note = (
        f"\n\nU-ViT training step (fwd + bwd + AdamW), depth 12, patch 4, 32x32x3, method cs, batch "
        f"{batch}, {device.type}, {torch.get_num_threads()} thread(s), {repeats} interleaved repeats.\n"
    )
    print(table + note)
    write_result(
        result_name("bf16_widths", device, args.quick),
        {"args": vars(args), "device": device.type, "batch": batch, "threads": torch.get_num_threads(),
         "repeats": repeats, "results": res},
        table + note,
    )  # fmt: skip


if __name__ == "__main__":
    main()
