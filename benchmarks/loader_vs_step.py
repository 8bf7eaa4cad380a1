"""Is data loading ever the bottleneck? CIFAR-10 loader throughput vs the U-ViT-S/2 training step.

A fake CIFAR-10 folder in the standard layout (python batches data_batch_1..5) is generated;
the recipe config (configs/cifar10_uvit_s2.yaml) trains on it. Timed in alternation:

* ``loader``: ``--batches`` global batches pulled from the run's DataLoader with **0 workers**
  (all decoding on the timing thread: a lower bound; the recipe's workers only add to it);
* ``step``: one training step of the recipe model at the same batch (fp32 on the CPU).

Goal: loader img/s >= 5x step img/s.

    python -m benchmarks.loader_vs_step            # 50,000 fake images, batch 32, 5 repeats
    python -m benchmarks.loader_vs_step --quick    # 5,000 fake images, batch 8, 2 repeats
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import interleaved_medians, markdown_table, write_result
from scalelong.training.config import load_config
from scalelong.training.launch import make_accelerator
from scalelong.training.train import Trainer


def fake_cifar10(root: Path, per_batch: int) -> Path:
    """data_batch_1..5 and test_batch of random pixels, in the official pickle format."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, per_batch).tolist(),
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    return root


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="5,000 images, batch 8, 2 repeats")
    p.add_argument("--batch", type=int, default=32, help="global batch (the recipe: 128)")
    p.add_argument("--batches", type=int, default=20, help="loader batches per timing")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="CPU threads (the machine is shared)")
    args = p.parse_args()
    if args.quick:
        args.batch, args.repeats = 8, 2
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        data = fake_cifar10(Path(tmp), 1000 if args.quick else 10000)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        cfg = load_config(
            "configs/cifar10_uvit_s2.yaml",
            [f"data.path={data}", "data.num_workers=0", f"train.batch_size={args.batch}", f"out_dir={tmp}"]
            + [f"train.device={device}", f"train.mixed_precision={'fp16' if device == 'cuda' else 'no'}"],
        )
        trainer = Trainer(cfg, make_accelerator(cfg), Path(tmp) / "run")
        loader = trainer.batches()
        images, labels = next(loader)

        def pull() -> None:
            for _ in range(args.batches):
                next(loader)

        medians = interleaved_medians(
            {"loader": pull, "step": lambda: trainer.train_step(images, labels)},
            repeats=args.repeats,
            warmup=1,
            device=trainer.acc.device,
        )
    loader_ips = args.batches * args.batch / medians["loader"]
    step_ips = args.batch / medians["step"]
    ratio = loader_ips / step_ips
    rows = [
        ["loader (0 workers)", f"{loader_ips:,.0f}", f"{ratio:.1f}x"],
        ["training step (U-ViT-S/2)", f"{step_ips:,.1f}", "1x"],
    ]
    table = (
        f"CIFAR-10 loader vs U-ViT-S/2 training step, batch {args.batch}, {device}, "
        f"{args.threads} threads (goal: loader >= 5x step)\n\n"
        + markdown_table(["what", "img/s", "vs step"], rows)
    )
    name = "loader_vs_step" + ("_quick" if args.quick else "")
    result = {"batch": args.batch, "device": device, "loader_img_s": loader_ips, "step_img_s": step_ips}
    path = write_result(name, {**result, "ratio": ratio, "goal_met": ratio >= 5}, table)
    print(table)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
