"""The reference step: the unit in which the project states time budgets that travel between machines.

The same `make demo` takes 440 s on one 2-core machine and 807 s on another of the same kind, so a
budget in seconds means nothing elsewhere. A budget here is a ratio: a job's wall time over the median
time of one step of a fixed workload, measured on the same machine in the same session. The workload
is a demo-sized transformer training step: 12 pre-norm blocks of width 64 with 4 heads, 64 tokens,
batch 32, an MSE loss, fused AdamW, bf16 autocast where the CPU computes bf16 natively (fp32
elsewhere: which one ran is printed), 2 threads.

It imports torch only, never scalelong, so no change to the package moves the unit:

    python -m benchmarks.reference_step              # prints the median step and its spread
    python -m benchmarks.reference_step --json out.json
    T_REF=$(python -m benchmarks.reference_step --seconds)   # the median, in seconds, for scripts

A job's cost in reference steps is then ``wall seconds / T_REF``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn

WIDTH, DEPTH, HEADS, TOKENS, BATCH = 64, 12, 4, 64, 32


class Block(nn.Module):
    """A pre-norm transformer block: attention and a 4x MLP, each behind a LayerNorm and a residual."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def bf16_native() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX), as oneDNN reports it."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def measure(steps: int = 30, warmup: int = 5, threads: int = 2, seed: int = 0) -> dict:
    """Time ``steps`` training steps after ``warmup``; the median, quartiles and the precision run."""
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    model = nn.Sequential(*(Block(WIDTH, HEADS) for _ in range(DEPTH)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(BATCH, TOKENS, WIDTH)
    target = torch.randn(BATCH, TOKENS, WIDTH)
    precision = "bf16" if bf16_native() else "fp32"
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = nn.functional.mse_loss(model(x).float(), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    q = statistics.quantiles(times, n=4)
    return {
        "median_s": statistics.median(times),
        "q1_s": q[0],
        "q3_s": q[2],
        "steps": steps,
        "threads": threads,
        "precision": precision,
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="timed steps (after 5 warm-up steps)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", action="store_true", help="print only the median step in seconds")
    p.add_argument("--json", type=Path, default=None, help="also write the result to this file")
    args = p.parse_args(argv)
    if args.steps < 3 or args.threads < 1:
        p.error("--steps must be >= 3 and --threads >= 1")
    result = measure(args.steps, threads=args.threads)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.seconds:
        print(f"{result['median_s']:.6f}")
    else:
        which = "this CPU has bf16 units" if result["precision"] == "bf16" else "no bf16 units here: fp32"
        print(
            f"reference step: median {1e3 * result['median_s']:.1f} ms (quartiles "
            f"{1e3 * result['q1_s']:.1f}-{1e3 * result['q3_s']:.1f} ms) over {result['steps']} steps, "
            f"{result['precision']} ({which}), {result['threads']} threads, torch {result['torch']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
