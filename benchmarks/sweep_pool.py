"""Wall time of a tiny `scalelong sweep` run by a pool of 2 workers, as a ratio to one after another.

The same sweep (the demo U-ViT made small: methods none, cs x two learning rates, one seed) is
run in alternation into fresh folders, so nothing is reused: ``--jobs 1`` (in this process, all
the cores' threads) and ``--jobs 2`` (two spawned workers, each with half the cores' threads);
for contrast, two workers that each keep every core's threads (what two torch processes started
side by side do), and one run after another on a single thread. The worker start-up (a fresh
interpreter importing torch) is part of the pool's time.

    python -m benchmarks.sweep_pool            # 200 steps per run, 3 repeats
    python -m benchmarks.sweep_pool --quick    # 60 steps per run, 2 repeats
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch

from benchmarks.harness import add_common_args, interleaved_medians, markdown_table, ratios, write_result
from scalelong.studies.running import train_run
from scalelong.studies.sweep import plan, run_sweep
from scalelong.training.config import load_config
from scalelong.training.launch import cpu_cores, pool_map

METHODS, LRS = ["none", "cs"], [2e-3, 5e-3]


def tiny_sweep(out_dir: Path, steps: int):
    overrides = [
        f"out_dir={out_dir}",
        "name=bench",
        "model.uvit.depth=4",
        "model.uvit.embed_dim=32",
        f"train.steps={steps}",
        "train.log_every=10",
        "train.checkpoint_every=0",
        "train.tensorboard=false",
        "train.device=cpu",
        "diagnostics.every=10",
        "eval.every=0",
        "sample.num_images=0",
    ]
    return load_config("configs/demo_uvit.yaml", overrides)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, threads=0)
    p.add_argument("--steps", type=int, default=0, help="steps per run (0: 200, --quick 60)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = args.steps or (60 if args.quick else 200)
    repeats = args.repeats or (2 if args.quick else 3)
    cores, root = cpu_cores(), Path(tempfile.mkdtemp(prefix="sweep_pool_"))
    counter = iter(range(10_000))

    def sweep(jobs: int):
        def fn() -> None:
            folder = root / f"run{next(counter)}"
            run_sweep(
                tiny_sweep(folder, steps), METHODS, LRS, None, 1, folder / "sweep", jobs, progress=False
            )

        return fn

    def oversubscribed() -> None:  # two workers with every core's threads each
        folder = root / f"run{next(counter)}"
        cfgs = plan(tiny_sweep(folder, steps), METHODS, LRS, None, 1, folder / "runs")
        for _, outcome in pool_map(train_run, [(c,) for c in cfgs], jobs=2, threads=cores):
            assert outcome.status == "trained", outcome

    def one_thread() -> None:  # one after another, each run on a single thread
        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            sweep(1)()
        finally:
            torch.set_num_threads(previous)

    train_run(tiny_sweep(root / "warmup", 2))  # imports and first-call costs, out of the timings
    arms = {
        "jobs 1": sweep(1),
        "jobs 2": sweep(2),
        "jobs 2, threads not divided": oversubscribed,
        "jobs 1, one thread": one_thread,
    }
    med = interleaved_medians(arms, repeats=repeats, warmup=0)
    r = ratios(med, "jobs 1")
    runs = len(METHODS) * len(LRS)
    threads = {
        "jobs 1": torch.get_num_threads(),
        "jobs 2": max(1, cores // 2),
        "jobs 2, threads not divided": cores,
        "jobs 1, one thread": 1,
    }
    rows = [[name, threads[name], med[name], r[name]] for name in med]
    table = markdown_table(["arm", "torch threads per run", "median s", "ratio to jobs 1"], rows)
    head = (
        f"# A tiny sweep in a pool of 2 workers vs one after another ({cores} cores, {runs} runs of "
        f"{steps} steps, demo U-ViT depth 4 width 32, {repeats} interleaved repeats)"
    )
    print(table)
    name = "sweep_pool" + ("_quick" if args.quick else "")
    result = {"steps": steps, "runs": runs, "cores": cores, "median_s": med, "ratio": r, "threads": threads}
    print(f"wrote {write_result(name, result, head + chr(10) * 2 + table)}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
