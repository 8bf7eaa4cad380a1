"""What a full-state checkpoint of U-ViT-S/2 costs: save time, verify and load time, size on disk.

The recipe model (configs/cifar10_uvit_s2.yaml, 44.3M parameters) with its EMA and a populated
AdamW state is checkpointed through :func:`scalelong.training.checkpoint.save_checkpoint` (safetensors,
torch.save, sha256 and fsync of every file, atomic rename). Timed in alternation against the
baseline ``torch.save(model.state_dict())`` (weights only, no checksum, no fsync).

    python -m benchmarks.checkpoint_cost            # 3 repeats
    python -m benchmarks.checkpoint_cost --quick    # 1 repeat
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch

from benchmarks.harness import interleaved_medians, markdown_table, write_result
from scalelong.training.build import build_model, count_parameters
from scalelong.training.checkpoint import checkpoint_problem, load_training_state, save_checkpoint
from scalelong.training.config import config_to_dict, load_config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", help="where to write (default: a temporary folder)")
    args = p.parse_args()
    repeats = 1 if args.quick else args.repeats

    cfg = load_config("configs/cifar10_uvit_s2.yaml")
    torch.manual_seed(0)
    model = build_model(cfg.model)
    ema = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for param in model.parameters():  # one step populates exp_avg / exp_avg_sq
        param.grad = torch.randn_like(param) * 1e-3
    optimizer.step()
    trainer = {"step": 1, "rng": [{"torch": torch.get_rng_state()}], "noise_gen": torch.get_rng_state()}

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        counter = iter(range(1, 10_000))

        def full() -> None:
            save_checkpoint(
                root / "ckpt",
                next(counter),
                model,
                ema,
                config_to_dict(cfg),
                optimizer.state_dict(),
                trainer,
                keep=1,
            )

        def baseline() -> None:
            torch.save(model.state_dict(), root / "weights.pt")

        medians = interleaved_medians(
            {"weights_only": baseline, "full_checkpoint": full}, repeats=repeats, warmup=1
        )
        latest = sorted((root / "ckpt").iterdir())[-1]
        sizes = {f.name: f.stat().st_size for f in sorted(latest.iterdir())}
        verify = interleaved_medians(
            {"verify": lambda: checkpoint_problem(latest), "load": lambda: load_training_state(latest)},
            repeats=repeats,
            warmup=0,
        )
    total = sum(sizes.values())
    rows = [
        ["torch.save(model.state_dict()) (baseline)", f"{medians['weights_only']:.2f}", "1x", ""],
        ["full checkpoint (save, checksum, fsync, rename)", f"{medians['full_checkpoint']:.2f}",
         f"{medians['full_checkpoint'] / medians['weights_only']:.1f}x", f"{total / 2**20:,.0f}"],
        ["verify (sha256 of every file)", f"{verify['verify']:.2f}", "", ""],
        ["load the full state", f"{verify['load']:.2f}", "", ""],
    ]  # fmt: skip
    rows += [[f"  {name}", "", "", f"{size / 2**20:,.1f}"] for name, size in sizes.items()]
    table = (
        f"Checkpoint cost, U-ViT-S/2 ({count_parameters(model):,} parameters), median of {repeats}\n\n"
        + markdown_table(["what", "seconds", "vs baseline", "MiB"], rows)
    )
    name = "checkpoint_cost" + ("_quick" if args.quick else "")
    result = {"seconds": {**medians, **verify}, "bytes": sizes, "total_bytes": total}
    path = write_result(name, result, table)
    print(table)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
