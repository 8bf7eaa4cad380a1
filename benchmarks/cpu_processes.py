"""`scalelong train demo_uvit` on a CPU as one process with every core's threads or as data-parallel
processes of one thread each (``train.cpu_processes``), side by side.

Each arm is the command line itself, so the processes' start-up, the process group and the
gradient all-reduce are in it: the demo preset (bf16, fused AdamW, its diagnostics) for a few
hundred steps into a fresh folder, without evaluation, samples or checkpoints but the last. What
is compared is the training throughput the run logs itself (``img_per_s`` of ``metrics.jsonl``,
the median over its records after the first quarter of the steps), and the command's wall time.
The arms alternate, so drift on the machine hits them alike.

    python -m benchmarks.cpu_processes            # 400 steps per run, 3 repeats
    python -m benchmarks.cpu_processes --quick    # 120 steps per run, 2 repeats
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import markdown_table, write_result
from scalelong.training.launch import cpu_cores


def train_command(folder: Path, steps: int, processes: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "scalelong.cli",
        "train",
        "demo_uvit",
        f"out_dir={folder}",
        "name=bench",
        f"train.steps={steps}",
        f"train.cpu_processes={processes}",
        "train.checkpoint_every=0",
        "train.tensorboard=false",
        "train.device=cpu",
        "eval.every=0",
        "sample.num_images=0",
        "--no-progress",
    ]


def run_arm(folder: Path, steps: int, processes: int, threads: int) -> tuple[float, float]:
    """(wall s, median logged img/s after the first quarter of the steps) of one training command."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    start = time.perf_counter()
    subprocess.run(train_command(folder, steps, processes), env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    return wall, logged_rate(folder / "bench" / "metrics.jsonl", steps)


def logged_rate(metrics_file: Path, steps: int) -> float:
    """The median ``img_per_s`` a run logged after the first quarter of its steps (start-up, the first
    calls' allocations and the warm-up of the thread pools stay out of it)."""
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    rates = [r["img_per_s"] for r in records if "img_per_s" in r and r["step"] > steps // 4]
    if not rates:
        raise ValueError(f"{metrics_file} logged no img_per_s after step {steps // 4}")
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    p.add_argument("--steps", type=int, default=0, help="steps per run (0: 400, --quick 120)")
    p.add_argument("--repeats", type=int, default=0, help="repeats per arm (0: 3, --quick 2)")
    args = p.parse_args(argv)
    steps = args.steps or (120 if args.quick else 400)
    repeats = args.repeats or (2 if args.quick else 3)
    cores = cpu_cores()
    arms = {  # name: (processes, threads per process)
        f"1 process, {cores} threads": (1, cores),
        f"{cores} processes, 1 thread each": (cores, 1),
        "1 process, 1 thread": (1, 1),
    }
    root = Path(tempfile.mkdtemp(prefix="cpu_processes_"))
    walls: dict[str, list[float]] = {a: [] for a in arms}
    rates: dict[str, list[float]] = {a: [] for a in arms}
    names = list(arms)
    for k in range(repeats):
        for name in names[k % len(names) :] + names[: k % len(names)]:  # rotated, as interleaved_medians
            folder = root / f"{k}-{names.index(name)}"
            wall, rate = run_arm(folder, steps, *arms[name])
            walls[name].append(wall)
            rates[name].append(rate)
            shutil.rmtree(folder, ignore_errors=True)
    base = names[0]
    img_s = {a: statistics.median(v) for a, v in rates.items()}
    wall_s = {a: statistics.median(v) for a, v in walls.items()}
    rows = [
        [a, arms[a][0], arms[a][1], f"{img_s[a]:.0f}", f"{img_s[a] / img_s[base]:.2f}", f"{wall_s[a]:.1f}"]
        for a in names
    ]
    header = ["arm", "processes", "threads each", "img/s (logged)", "img/s ratio", "wall s"]
    table = markdown_table(header, rows)
    head = (
        f"# `scalelong train demo_uvit` as processes of one thread vs one process ({cores} cores, {steps} "
        f"steps, batch 32, {repeats} alternating repeats)"
    )
    print(table)
    name = "cpu_processes" + ("_quick" if args.quick else "")
    result = {
        "steps": steps,
        "cores": cores,
        "repeats": repeats,
        "img_per_s": img_s,
        "wall_s": wall_s,
        "table": table,
    }
    print(f"wrote {write_result(name, result, head + chr(10) * 2 + table)}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
