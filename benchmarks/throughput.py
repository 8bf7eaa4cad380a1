"""Training throughput (img/s) and peak memory of the shipped configs, each in its own process.

Every config runs :meth:`scalelong.training.train.Trainer.train_step` (the real step: noise draws,
forward, loss, backward, grad norm, AdamW, EMA) in a fresh subprocess, so the peak memory of
one config is not inflated by another's. Peak memory: on CUDA ``torch.cuda.max_memory_allocated``
during the timed steps; on the CPU the process's peak resident set (``ru_maxrss``) and its
growth from the moment the trainer (model, EMA, data) is built: activations, gradients and
optimizer state.

* ``demo``: configs/demo_uvit.yaml at its own batch (64);
* ``U-ViT-S/2``: configs/cifar10_uvit_s2.yaml, ``DDPM UNet``: configs/cifar10_unet_ddpm.yaml,
  both at batch 8 on the CPU (``--batch``; 128 on a GPU) on a small fake CIFAR-10 folder.

    python -m benchmarks.throughput --quick                       # 3 timed steps per config
    python -m benchmarks.throughput --device cuda --batch 128 --precision bf16
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness import add_common_args, markdown_table, result_name, setup, write_result

CONFIGS = {
    "demo U-ViT": ("configs/demo_uvit.yaml", None),
    "U-ViT-S/2 CIFAR-10": ("configs/cifar10_uvit_s2.yaml", 8),
    "DDPM UNet CIFAR-10": ("configs/cifar10_unet_ddpm.yaml", 8),
}


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def worker(args) -> dict:
    """One config in this process: time ``steps`` training steps, report img/s and memory."""
    from benchmarks.loader_vs_step import fake_cifar10
    from scalelong.training.config import load_config
    from scalelong.training.launch import make_accelerator
    from scalelong.training.train import Trainer

    device = setup(args)
    path, default_batch = CONFIGS[args.config]
    batch = args.batch or default_batch
    with tempfile.TemporaryDirectory() as tmp:
        over = [f"out_dir={tmp}", f"train.device={device.type}", f"train.mixed_precision={args.precision}"]
        over += [f"train.batch_size={batch}"] if batch else []
        over += ["train.compile=true"] if args.compile else []
        if "cifar10" in path:
            over += [f"data.path={fake_cifar10(Path(tmp), 64)}", "data.name=cifar10", "data.num_workers=0"]
        cfg = load_config(path, over)
        trainer = Trainer(cfg, make_accelerator(cfg), Path(tmp) / "run")
        images, labels = next(trainer.batches())
        base_rss = _rss_mib()  # model, EMA and data are in; activations, grads, AdamW state are not
        for _ in range(args.warmup):
            trainer.train_step(images, labels)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            loss, _, _ = trainer.train_step(images, labels)
            float(loss)  # waits for the device
            times.append(time.perf_counter() - t0)
        out = {
            "config": path,
            "batch": cfg.train.batch_size,
            "device": device.type,
            "precision": args.precision,
            "img_s": cfg.train.batch_size / statistics.median(times),
            "step_s": statistics.median(times),
            "parameters": sum(p.numel() for p in trainer.unwrapped.parameters()),
        }
        if device.type == "cuda":
            out["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        else:
            out["peak_mib"], out["step_growth_mib"] = _rss_mib(), _rss_mib() - base_rss
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, threads=0)
    p.add_argument("--batch", type=int, default=0, help="batch of the CIFAR shapes (0: 8; the demo keeps 64)")
    p.add_argument("--precision", default="no", help="train.mixed_precision: no | bf16 | fp16")
    p.add_argument("--compile", action="store_true", help="train.compile=true")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--config", help=argparse.SUPPRESS)  # worker mode: one config, JSON on stdout
    p.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.config:
        print("RESULT " + json.dumps(worker(args)))
        return
    device = setup(args)
    steps = args.repeats or (3 if args.quick else 10)
    results, rows = {}, []
    for name in args.configs:
        cmd = [sys.executable, "-m", "benchmarks.throughput", "--config", name, "--steps", str(steps)]
        cmd += ["--device", device.type, "--threads", str(args.threads), "--precision", args.precision]
        cmd += (["--batch", str(args.batch)] if args.batch else []) + (["--compile"] if args.compile else [])
        done = subprocess.run(cmd, capture_output=True, text=True)
        line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if done.returncode or not line:
            print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"throughput: {name} failed (exit {done.returncode})")
        r = results[name] = json.loads(line[0][7:])
        growth = f"{r['step_growth_mib']:,.0f}" if "step_growth_mib" in r else ""
        rows.append(
            [name, f"{r['parameters']:,}", r["batch"], f"{r['img_s']:.2f}", f"{r['peak_mib']:,.0f}", growth]
        )
        print(f"{name}: {r['img_s']:.2f} img/s, peak {r['peak_mib']:,.0f} MiB", flush=True)
    mem = "peak allocated MiB" if device.type == "cuda" else "peak RSS MiB"
    table = markdown_table(["config", "parameters", "batch", "img/s", mem, "growth in training MiB"], rows)
    threads = args.threads or torch.get_num_threads()
    note = (
        f"\n\nTrainer.train_step, {device.type}"
        + (f" ({threads} threads)" if device.type == "cpu" else "")
        + f", precision {args.precision}{', compiled' if args.compile else ''}, median of {steps} steps "
        "after 1 warm-up, one process per config.\n"
    )
    print(table + note)
    tag = "" if args.precision == "no" else args.precision
    write_result(
        result_name("throughput", device, args.quick, tag),
        {"args": vars(args), "device": device.type, "results": results},
        table + note,
    )


if __name__ == "__main__":
    main()
