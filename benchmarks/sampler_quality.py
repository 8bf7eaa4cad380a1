"""Sample quality per network evaluation: DPM-Solver (50 steps) against Euler-Maruyama (1000 steps).

The recipe evaluates with a 50-step DPM-Solver and samples its final CIFAR-10 numbers with a
1000-step Euler-Maruyama SDE solver. On the demo U-ViT trained for 3,000 steps (configs/demo_uvit.yaml,
name bench-demo; trained here if missing) both draw the same seeds and are scored with FD-MNIST
against the embedded training digits. Claim: DPM-Solver-50 is within 10% of EM-1000 at 20x
fewer network evaluations.

    python -m benchmarks.sampler_quality            # 500 samples per sampler
    python -m benchmarks.sampler_quality --quick    # 100 samples, fewer samplers
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.harness import markdown_table, write_result
from scalelong.data import embedded_mnist
from scalelong.metrics.frechet import fd_mnist_features, fd_of_images, mnist_reference_stats
from scalelong.sampling import network_evaluations
from scalelong.training.evaluation import score_model
from scalelong.training.runs import RunDir

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "runs" / "bench-demo"


def ensure_trained(run_dir: Path = RUN) -> None:
    """Train the demo model for 3,000 steps once (about 7 min on 2 idle cores) unless a checkpoint exists."""
    if any((run_dir / "checkpoints").glob("step-*/ema.safetensors")):
        return
    cmd = [
        sys.executable,
        "-m",
        "scalelong.cli",
        "train",
        "configs/demo_uvit.yaml",
        "name=bench-demo",
        "train.steps=3000",
        "eval.every=0",
        "diagnostics.every=0",
        "train.checkpoint_every=1000",
        "--overwrite",
    ]
    print("training the demo model:", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100 samples and only the two headline samplers")
    p.add_argument("--n", type=int, help="samples per sampler (default 500, quick 100)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument(
        "--run", type=Path, default=RUN, help="a trained run (default: runs/bench-demo, trained if missing)"
    )
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    n = args.n or (100 if args.quick else 500)

    if args.run == RUN:
        ensure_trained()
    cfg, model, ckpt = RunDir(args.run).load_model()
    cfg.eval.batch_size = n  # one batch per network evaluation
    features, ref = fd_mnist_features(), mnist_reference_stats("train")
    runs = [("dpm_solver", 50), ("euler_maruyama", 1000)]
    if not args.quick:
        runs += [("dpm_solver_pp", 50), ("ddim", 50), ("ode_euler", 50), ("dpm_solver", 20)]

    rows, results = [], {}
    for sampler, steps in runs:
        t0 = time.perf_counter()
        fd = score_model(model, cfg, features, ref, n, sampler, steps).fd
        seconds = time.perf_counter() - t0
        nfe = network_evaluations(sampler, steps)
        results[f"{sampler}-{steps}"] = {"fd_mnist": fd, "nfe": nfe, "seconds": seconds}
        rows.append([sampler, steps, nfe, fd, seconds])
        print(
            f"{sampler:>15} {steps:>5} steps  NFE {nfe:>5}  FD-MNIST {fd:8.3f}  {seconds:7.1f} s", flush=True
        )

    real = fd_of_images(features, embedded_mnist("test")[0][:n], ref)  # the floor at this sample size
    rows.append([f"real test digits (n={n})", "-", 0, real, 0.0])
    fast, slow = results["dpm_solver-50"], results["euler_maruyama-1000"]
    rel = fast["fd_mnist"] / slow["fd_mnist"] - 1
    summary = (
        f"DPM-Solver-50 FD-MNIST {fast['fd_mnist']:.3f} vs Euler-Maruyama-1000 {slow['fd_mnist']:.3f}: "
        f"{100 * rel:+.1f}% at {slow['nfe'] / fast['nfe']:.1f}x fewer network evaluations "
        f"({'within' if rel <= 0.10 else 'NOT within'} 10%)"
    )
    print(summary)
    table = (
        f"# Sampler quality, demo model ({args.run.name}/{ckpt.name}), {n} samples, FD-MNIST\n\n"
        + markdown_table(["sampler", "steps", "NFE", "FD-MNIST", "seconds"], rows)
        + f"\n\n{summary}\n"
    )
    out = write_result(
        "sampler_quality" + ("_quick" if args.quick else ""),
        {"n": n, "checkpoint": str(ckpt), "results": results, "real_fd_mnist": real,
         "relative_difference": rel},
        table,
    )  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
