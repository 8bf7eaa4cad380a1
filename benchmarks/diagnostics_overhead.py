"""Step-time overhead of :class:`scalelong.diagnostics.Diagnostics`, as a ratio to a plain step.

Three training steps of the same U-ViT are timed in alternation: without diagnostics, with
diagnostics attached on a step that is not logged (hooks disarmed), and on a logged step (hooks
armed, statistics collected). The overhead at interval N is the amortised ratio
((N - 1) * unlogged + logged) / (N * plain) - 1.

    .venv/bin/python benchmarks/diagnostics_overhead.py [--every 100] [--method ls] [--repeats 20]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.harness import interleaved_medians, markdown_table, ratios, write_result
from scalelong.diagnostics import Diagnostics
from scalelong.diffusion import VPSDE, training_loss
from scalelong.models.uvit import UViT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=100, help="diagnostic interval (the config default)")
    ap.add_argument("--method", default="ls", help="skip method (ls exercises the coefficient statistics)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=128, help="embedding width D")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads; 0: torch's default")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    # A small CIFAR-shaped U-ViT (12 blocks, 6 skips) so the CPU can time it in a few minutes.
    model = UViT(32, 4, 3, args.width, 12, 4, skip_method=args.method).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    schedule, gen = VPSDE(), torch.Generator().manual_seed(0)
    x0 = torch.randn(args.batch, 3, 32, 32).to(args.device)
    diag = Diagnostics(model, every=args.every)

    def step(index: int | None) -> None:
        if index is not None:
            diag.arm(index)
        loss = training_loss(model, schedule, x0, gen).mean()
        loss.backward()
        if index is not None:
            diag.collect(index, loss.item())  # {} on an unarmed step
        opt.step()
        opt.zero_grad(set_to_none=True)

    def plain() -> None:
        diag.detach()
        step(None)

    def unlogged() -> None:
        diag.attach()
        step(1)  # 1 is not a multiple of every > 1: hooks stay disarmed

    def logged() -> None:
        diag.attach()
        step(args.every)

    med = interleaved_medians(
        {"plain": plain, "unlogged": unlogged, "logged": logged}, repeats=args.repeats, device=args.device
    )
    r = ratios(med, "plain")
    n = args.every
    overhead = ((n - 1) * r["unlogged"] + r["logged"]) / n - 1.0
    rows = [[name, med[name] * 1e3, r[name]] for name in med]
    rows.append([f"amortised at every={n}", "", 1.0 + overhead])
    # plain and unlogged run the same code (no hook is installed), so their ratio is the noise floor.
    noise = abs(r["unlogged"] - 1.0)
    table = markdown_table(["step", "median ms", "ratio to plain"], rows)
    print(table)
    print(f"overhead at every={n}: {100 * overhead:.2f}% (noise floor +-{100 * noise:.1f}%)")
    path = write_result(
        "diagnostics_overhead",
        {"args": vars(args), "median_s": med, "ratio": r, "overhead": overhead, "noise": noise},
        f"Diagnostics overhead (U-ViT D={args.width}, {args.method}, batch {args.batch}, {args.device})"
        f"\n\n{table}\n\namortised overhead at every={n}: {100 * overhead:.2f}% "
        f"(noise floor: unlogged vs plain, same code, +-{100 * noise:.1f}%)",
    )
    print(f"written {path}")


if __name__ == "__main__":
    main()
