"""Sampling throughput (images per second) of the demo model on this machine's CPU.

The demo U-ViT (configs/demo_uvit.yaml, random weights: speed does not depend on them) draws batches
with DPM-Solver (50 steps) and Euler-Maruyama; the two are timed in alternation (harness) at a
few batch sizes. Euler-Maruyama is timed at 50 steps and scaled to its 1000-step cost by the
ratio of network evaluations (1001 / 51), which is exact up to the per-step arithmetic.

    python -m benchmarks.sampling_throughput
    python -m benchmarks.sampling_throughput --quick
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.harness import interleaved_medians, markdown_table, write_result
from scalelong.sampling import generate, network_evaluations
from scalelong.training.build import build_model, build_schedule, model_input_shape
from scalelong.training.config import load_config


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one batch size, fewer repeats")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config("configs/demo_uvit.yaml")
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    schedule, shape = build_schedule(cfg.diffusion), model_input_shape(cfg.model)
    batch_sizes, repeats = ([64], 2) if args.quick else ([16, 64, 256], 3)

    rows, results = [], {}
    for b in batch_sizes:
        seeds = list(range(b))

        def draw(sampler: str, steps: int, seeds: list[int] = seeds):
            return lambda: generate(model, schedule, sampler, steps, seeds, shape)

        med = interleaved_medians(
            {"dpm_solver-50": draw("dpm_solver", 50), "euler_maruyama-50": draw("euler_maruyama", 50)},
            repeats=repeats,
            warmup=1,
        )
        em_scale = network_evaluations("euler_maruyama", 1000) / network_evaluations("euler_maruyama", 50)
        dpm_ips, em_ips = b / med["dpm_solver-50"], b / (med["euler_maruyama-50"] * em_scale)
        per_nfe_ms = 1000 * med["dpm_solver-50"] / 50
        results[b] = {
            "dpm_solver_50_img_s": dpm_ips,
            "euler_maruyama_1000_img_s": em_ips,
            "ms_per_nfe": per_nfe_ms,
        }
        rows.append([b, dpm_ips, em_ips, dpm_ips / em_ips, per_nfe_ms])
        print(f"batch {b:>4}: DPM-Solver-50 {dpm_ips:7.2f} img/s, EM-1000 {em_ips:6.3f} img/s", flush=True)

    table = (
        f"# Sampling throughput, demo model on CPU ({torch.get_num_threads()} threads)\n\n"
        + markdown_table(
            ["batch", "DPM-Solver-50 img/s", "EM-1000 img/s", "speed-up", "ms per network eval"], rows
        )
    )
    name = "sampling_throughput" + ("_quick" if args.quick else "")
    print(f"wrote {write_result(name, {'batches': results}, table)}")


if __name__ == "__main__":
    main()
