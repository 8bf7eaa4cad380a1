"""Overhead of ``apply_scalelong`` on a diffusers UNet2DModel: training-step time per method.

The same diffusers network (the DDPM CIFAR-10 architecture) is timed plain and with each
method applied, in alternation. Goals: cs <= 1.01x, ls <= 1.03x the plain step time.

    python -m benchmarks.adapter_overhead            # DDPM CIFAR-10 size, batch 8
    python -m benchmarks.adapter_overhead --quick    # a quarter of the width, 2 repeats
"""

from __future__ import annotations

import argparse
import copy

import torch

from benchmarks.harness import interleaved_medians, markdown_table, ratios, write_result
from benchmarks.unet_vs_diffusers import Tensorised, count, diffusers_ddpm, train_step_fn
from scalelong.adapters import apply_scalelong

METHODS = ("cs", "ls", "ls-nonshare")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="base width 32, 2 repeats")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="CPU threads (the machine is shared)")
    args = p.parse_args()
    base = 32 if args.quick else 128
    repeats = 2 if args.quick else args.repeats
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    plain = diffusers_ddpm(base)
    models = {"plain": plain}
    for method in METHODS:
        models[method] = apply_scalelong(copy.deepcopy(plain), method=method, kappa=0.7)
    fns = {name: train_step_fn(Tensorised(m), args.batch) for name, m in models.items()}
    med = interleaved_medians(fns, repeats=repeats, warmup=1)
    rel = ratios(med, "plain")
    goal = {"plain": "", "cs": "<= 1.01", "ls": "<= 1.03", "ls-nonshare": ""}
    rows = [
        [
            name,
            f"{count(models[name]) - count(plain):,}",
            f"{med[name] * 1000:.0f}",
            f"{rel[name]:.3f}",
            goal[name],
        ]
        for name in models
    ]
    table = markdown_table(["method", "added parameters", "step ms (median)", "ratio to plain", "goal"], rows)
    note = (
        f"\n\ndiffusers UNet2DModel, DDPM CIFAR-10 architecture at base {base}, training step "
        f"(fwd + bwd + AdamW) at batch {args.batch}, CPU, {args.threads} thread(s), {repeats} interleaved "
        "repeats.\n"
    )
    print(table + note)
    write_result(
        "adapter_overhead_quick" if args.quick else "adapter_overhead",
        {"args": vars(args), "median_s": med, "ratio": rel},
        table + note,
    )


if __name__ == "__main__":
    main()
