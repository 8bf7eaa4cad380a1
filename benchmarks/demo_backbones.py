"""The demo's UNet against the demo U-ViT: one training step each, side by side in one process.

    python -m benchmarks.demo_backbones              # batch 32, 1 thread (a make demo worker), fp32
    python -m benchmarks.demo_backbones --threads 2 --quick

The demo's step counts are set by this ratio: `scalelong train demo` trains the UNet for 3,500
steps because they cost what the U-ViT's 4,200 did, and `make demo` 1,750 for the U-ViT's 2,100;
both hold while a UNet step costs at most 1.2x a U-ViT step. A step is the trainer's (the preset's
loss, backward, the gradient norm, the fused AdamW, the EMA), on the same batch of digits. bf16 is
timed too where the CPU computes it natively (the demo trains in bf16 there); elsewhere bf16 is
emulated, several times slower than fp32, and the demo trains in fp32, so only fp32 is timed.
The sampler's forward at the evaluation's batch is timed too: a study's evaluations sample with it.
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
    write_result,
)
from benchmarks.train_step import forward_fn, step_fn

BACKBONES = {"UNet (demo)": "demo", "U-ViT (demo_uvit)": "demo_uvit"}
TARGET = 1.2  # 3,500 / 4,200 and 1,750 / 2,100 steps: the UNet may cost up to 1.2x a U-ViT step


def precisions() -> dict[str, torch.dtype | None]:
    """fp32 always; bf16 where this CPU computes it natively (as the trainer decides)."""
    from scalelong.training.launch import cpu_has_bf16

    return {"fp32": None, **({"bf16": torch.bfloat16} if cpu_has_bf16() else {})}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, threads=1)
    p.add_argument("--batch", type=int, default=32, help="training batch (the demo's: 32)")
    p.add_argument("--eval-batch", type=int, default=256, help="the sampler's batch (the demo's: 256)")
    args = p.parse_args(argv)
    setup(args)
    repeats = args.repeats or (5 if args.quick else 15)
    res = {}
    for label, amp in precisions().items():
        for work, make in (
            ("training step", lambda preset, amp=amp: step_fn(preset, args.batch, amp=amp, adamw="fused")),
            ("sampler forward", lambda preset, amp=amp: forward_fn(preset, args.eval_batch, amp)),
        ):
            fns = {name: make(preset) for name, preset in BACKBONES.items()}
            med = interleaved_medians(fns, repeats=repeats, warmup=2)
            ratio = ratios(med, "U-ViT (demo_uvit)")["UNet (demo)"]
            # the goal is the training step's; the sampler's forward is reported beside it
            met = ratio <= TARGET if work == "training step" else None
            res[f"{work}, {label}"] = {"median_s": med, "ratio": ratio, "met": met}
            print(f"{work}, {label}: UNet / U-ViT {ratio:.3f}", flush=True)
    rows = [
        [label, *(f"{r['median_s'][n] * 1e3:.1f}" for n in BACKBONES), f"{r['ratio']:.3f}",
         *((f"≤ {TARGET}", "met" if r["met"] else "MISSED") if r["met"] is not None else ("", ""))]
        for label, r in res.items()
    ]  # fmt: skip
    header = ["what, precision", *(f"{n} ms" for n in BACKBONES), "UNet / U-ViT", "goal", "status"]
    table = markdown_table(header, rows)
    note = (
        f"\n\nOne training step of each demo preset's network (its loss, backward, gradient norm, fused "
        f"AdamW, EMA) at batch {args.batch}, and one forward of the sampler at batch {args.eval_batch}, "
        f"{torch.get_num_threads()} thread(s), {repeats} interleaved "
        f"repeats{'' if 'bf16' in precisions() else '; bf16 not timed: this CPU has no bf16 instructions'}.\n"
    )
    print(table + note)
    write_result(
        result_name("demo_backbones", torch.device("cpu"), args.quick),
        {"args": vars(args), "batch": args.batch, "eval_batch": args.eval_batch,
         "threads": torch.get_num_threads(), "repeats": repeats, "target": TARGET, "results": res,
         "table": table + note},
        table + note,
    )  # fmt: skip


if __name__ == "__main__":
    main()
