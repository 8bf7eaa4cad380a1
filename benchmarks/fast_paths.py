"""Candidate fast paths, each timed against the plain path in alternation (one process).

* ``channels_last`` memory format for the UNet (fp32);
* bf16 autocast (``train.mixed_precision=bf16``) against fp32, U-ViT and UNet;
* ``torch.compile`` (``train.compile=true``): the compile time (first step minus an eager step)
  is reported apart from the step time of the compiled model.

A path is worth keeping where its ratio is clearly below 1 (beyond the noise floor of
``method_overhead``); the summary marks each one.

    python -m benchmarks.fast_paths            # U-ViT-S/2 and the DDPM UNet, batch 8, compile both
    python -m benchmarks.fast_paths --quick    # small models, compile only the U-ViT

On a CPU with bf16 matrix units the bf16 answer flips with the width; ``benchmarks.bf16_widths``
times it per U-ViT width.
"""

from __future__ import annotations

import argparse
import time

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
from benchmarks.method_overhead import unet, uvit


def compare(fns: dict, repeats: int, device: torch.device) -> dict:
    med = interleaved_medians(fns, repeats=repeats, warmup=1, device=device)
    base = next(iter(fns))
    return {"median_s": med, "ratio": ratios(med, base)}


def compile_case(build, method: str, args, device: torch.device, repeats: int) -> dict:
    """Eager vs torch.compile'd training step; the first compiled step's extra time is the compile time."""
    eager = training_step(build(method, args.quick), args.batch, device=device)
    model = build(method, args.quick)
    compiled = training_step(model, args.batch, device=device, forward=torch.compile(model))
    eager()  # warm the eager path so the comparison below is fair
    t0 = time.perf_counter()
    compiled()  # traces and compiles forward and backward
    first = time.perf_counter() - t0
    r = compare({"eager": eager, "compiled": compiled}, repeats, device)
    r["compile_s"] = first - r["median_s"]["compiled"]
    return r


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile cases")
    args = p.parse_args(argv)
    device = setup(args)
    repeats = args.repeats or (7 if args.quick else 5)
    low = torch.bfloat16  # torch's own fp16 autocast is a GPU's; bf16 is the precision both devices share
    res: dict[str, dict] = {}

    res["UNet channels_last"] = compare(
        {
            "contiguous": training_step(unet("cs", args.quick), args.batch, device=device),
            "channels_last": training_step(
                unet("cs", args.quick), args.batch, device=device, channels_last=True
            ),
        },
        repeats,
        device,
    )
    for name, build in (("U-ViT", uvit), ("UNet", unet)):
        res[f"{name} bf16 autocast"] = compare(
            {
                "fp32": training_step(build("cs", args.quick), args.batch, device=device),
                "bf16": training_step(build("cs", args.quick), args.batch, device=device, amp=low),
            },
            repeats,
            device,
        )
        print(name, "bf16 / fp32:", f"{res[f'{name} bf16 autocast']['ratio']['bf16']:.3f}", flush=True)
    if not args.no_compile:
        for name, build in (("U-ViT", uvit), ("UNet", unet))[: 1 if args.quick else 2]:
            res[f"{name} torch.compile"] = compile_case(build, "cs", args, device, repeats)
            print(name, "compiled / eager:", f"{res[f'{name} torch.compile']['ratio']['compiled']:.3f}")

    rows = []
    for case, r in res.items():
        base, cand = list(r["median_s"])
        extra = f"compile {r['compile_s']:.0f} s" if "compile_s" in r else ""
        rows.append([case, f"{r['median_s'][base] * 1e3:.1f}", f"{r['median_s'][cand] * 1e3:.1f}",
                     f"{r['ratio'][cand]:.3f}", extra])  # fmt: skip
    table = markdown_table(["fast path", "plain ms", "fast path ms", "ratio", "note"], rows)
    note = (
        f"\n\nTraining step (fwd + bwd + AdamW) with method cs, batch {args.batch}, {device.type}, "
        f"{torch.get_num_threads()} thread(s), {repeats} interleaved repeats; "
        f"{'small models (U-ViT D=128, UNet base 32)' if args.quick else 'U-ViT-S/2 and the DDPM UNet'}.\n"
    )
    print(table + note)
    write_result(
        result_name("fast_paths", device, args.quick),
        {"args": vars(args), "device": device.type, "results": res},
        table + note,
    )


if __name__ == "__main__":
    main()
