"""Choose the UNet's default kappa by measurement: a tiny UNet on the embedded MNIST digits.

Trains the same tiny UNet (ch 16, mult 1,2,2, 2 res blocks: 9 skips) on the digits average-
pooled to 16x16 (so a run fits a shared CPU core) for a few hundred steps with ``cs`` at
several kappas (kappa = 1 is ``none``), several seeds each, and reports the held-out denoising
loss (fixed test images, times and noise) and the gradient-norm spread.

    python -m benchmarks.unet_kappa_sweep            # full sweep (about 15 min on 1 core)
    python -m benchmarks.unet_kappa_sweep --quick    # smoke run
    python -m benchmarks.unet_kappa_sweep --kappas 1 --methods ls ls-nonshare --seeds 2 --out unet_ls_compare
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.harness import markdown_table, write_result
from scalelong.data import embedded_mnist
from scalelong.diffusion import VPSDE, add_noise
from scalelong.models.unet import UNet


def tiny_unet(method: str, kappa: float, img_size: int = 16, channels: int = 16) -> UNet:
    return UNet(
        img_size=img_size,
        in_channels=1,
        base_channels=channels,
        channel_mult=(1, 2, 2),
        num_res_blocks=2,
        attn_resolutions=(img_size // 2,),
        dropout=0.0,
        norm_groups=8,
        skip_method=method,
        kappa=kappa,
    )


def eval_loss(model: UNet, sde: VPSDE, images: torch.Tensor, seed: int = 1234) -> float:
    """Denoising MSE on fixed test images with fixed times and noise (the same for every run)."""
    gen = torch.Generator().manual_seed(seed)
    t = sde.sample_t(len(images), gen)
    noise = torch.randn(images.shape, generator=gen)
    model.eval()
    with torch.no_grad():
        losses = []
        for i in range(0, len(images), 128):
            sl = slice(i, i + 128)
            pred = model(add_noise(sde, images[sl], t[sl], noise[sl]), sde.model_time(t[sl]))
            losses.append((pred - noise[sl]).square().mean(dim=(1, 2, 3)))
    model.train()
    return torch.cat(losses).mean().item()


def runs_of(args: argparse.Namespace) -> list[tuple[str, float]]:
    """(method, kappa) of every run of one seed: cs at each kappa (1 means none), then learned methods."""
    return [("none" if k == 1.0 else "cs", k) for k in args.kappas] + [(m, 1.0) for m in args.methods]


def label(method: str, kappa: float) -> str:
    return f"cs, kappa={kappa:g}" if method == "cs" else method


def run(method: str, kappa: float, seed: int, args: argparse.Namespace, train_x, test_x) -> dict:
    steps, batch = args.steps, args.batch
    torch.manual_seed(seed)
    model = tiny_unet(method, kappa, train_x.shape[-1], args.channels)
    sde = VPSDE()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.03)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    gen = torch.Generator().manual_seed(seed)
    losses, gnorms = [], []
    for _ in range(steps):
        idx = torch.randint(len(train_x), (batch,), generator=gen)
        x0 = train_x[idx]
        t = sde.sample_t(batch, gen)
        noise = torch.randn(x0.shape, generator=gen)
        loss = (model(add_noise(sde, x0, t, noise), sde.model_time(t)) - noise).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item())
        opt.step()
        sched.step()
        losses.append(loss.item())
    tail = max(1, steps // 5)
    return {
        "method": method,
        "kappa": kappa,
        "seed": seed,
        "train_loss_tail": statistics.mean(losses[-tail:]),
        "eval_loss": eval_loss(model, sde, test_x),
        "grad_norm_median": statistics.median(gnorms),
        "grad_norm_max": max(gnorms),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few steps, one seed: checks the script runs")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--time-limit", type=float, default=900, help="start no new run after this many seconds")
    p.add_argument("--img", type=int, default=16, help="image side (digits are average-pooled)")
    p.add_argument("--channels", type=int, default=16, help="base width of the tiny UNet")
    p.add_argument("--kappas", type=float, nargs="+", default=[0.5, 0.7, 0.8, 0.9, 1.0])
    p.add_argument("--methods", nargs="*", default=[], help="learned methods to add, e.g. ls ls-nonshare")
    p.add_argument("--out", default="unet_kappa_sweep", help="result name in benchmarks/results")
    args = p.parse_args()
    if args.quick:
        args.steps, args.seeds, args.kappas = 5, 1, [0.7, 1.0]
    torch.set_num_threads(1)  # shares the machine; also makes runs reproducible
    train_x, _ = embedded_mnist("train")
    test_x, _ = embedded_mnist("test")
    test_x = test_x[:256]
    if args.img != 32:
        train_x, test_x = (torch.nn.functional.adaptive_avg_pool2d(x, args.img) for x in (train_x, test_x))

    runs, t0 = [], time.perf_counter()
    for seed in range(args.seeds):  # seed-major: a time limit still leaves whole seeds
        if time.perf_counter() - t0 > args.time_limit:
            print(f"time limit reached: {seed} seed(s) done", flush=True)
            break
        for method, kappa in runs_of(args):
            r = run(method, kappa, seed, args, train_x, test_x)
            runs.append(r)
            print(
                f"{label(method, kappa)} seed={seed}: eval {r['eval_loss']:.4f} "
                f"train {r['train_loss_tail']:.4f} "
                f"grad median {r['grad_norm_median']:.3g} max {r['grad_norm_max']:.3g} "
                f"[{time.perf_counter() - t0:.0f}s]",
                flush=True,
            )
    report(runs, args, time.perf_counter() - t0)


def report(runs: list[dict], args: argparse.Namespace, elapsed: float) -> None:
    """Print and save the table: one row per method / kappa, means over the seeds run."""
    rows = []
    seeds_done = len({r["seed"] for r in runs})
    for method, kappa in runs_of(args):
        rs = [r for r in runs if (r["method"], r["kappa"]) == (method, kappa)]
        ev = [r["eval_loss"] for r in rs]
        rows.append(
            [
                label(method, kappa),
                f"{statistics.mean(ev):.4f} ± {statistics.stdev(ev) if len(ev) > 1 else 0:.4f}",
                f"{statistics.mean(r['train_loss_tail'] for r in rs):.4f}",
                f"{statistics.mean(r['grad_norm_median'] for r in rs):.3g}",
                f"{max(r['grad_norm_max'] for r in rs):.3g}",
            ]
        )
    header = ["method", "eval loss (mean ± sd)", "train loss, last 20%", "grad norm median", "grad norm max"]
    table = markdown_table(header, rows)
    note = (
        f"\n\nTiny UNet (ch {args.channels}, mult 1,2,2, 2 res blocks, 9 skips), embedded MNIST at "
        f"{args.img}x{args.img}, {args.steps} steps, "
        f"batch {args.batch}, AdamW lr 1e-3, {seeds_done} seed(s), 1 thread, "
        f"{elapsed:.0f} s.\n"
    )
    print(table + note)
    name = f"{args.out}_quick" if args.quick else args.out
    write_result(name, {"args": vars(args), "runs": runs}, table + note)


if __name__ == "__main__":
    main()
