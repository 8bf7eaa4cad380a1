"""Side-by-side timing: interleaved repetitions in one process, medians and ratios.

Absolute times on a shared machine drift; ratios of things timed in alternation do not, so
every result here is reported as a ratio to a named baseline.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"


def _sync(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def interleaved_medians(
    fns: dict[str, Callable[[], object]],
    repeats: int = 10,
    warmup: int = 2,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Median seconds per call of each function, timed round-robin (rotated) so drift hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for rep in range(repeats):
        # rotate the order every round: no entry always runs first (after the previous round's last)
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            fn = fns[name]
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def ratios(medians: dict[str, float], baseline: str) -> dict[str, float]:
    return {name: t / medians[baseline] for name, t in medians.items()}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux): ratios such as bf16 / fp32 depend on it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    from scalelong.training.launch import cpu_has_bf16

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_bf16": cpu_has_bf16(),
        "threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def write_result(name: str, result: dict, table: str) -> Path:
    """Save ``results/<name>.json`` (numbers + machine) and ``results/<name>.md`` (the table)."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": machine(), **result}, indent=1))
    (RESULTS / f"{name}.md").write_text(table.rstrip() + "\n")
    return RESULTS / f"{name}.md"


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    def fmt(v: object) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- shared pieces


def add_common_args(p, threads: int = 1) -> None:
    """--quick, --device, --threads, --repeats: the flags every benchmark of ``python -m benchmarks`` has."""
    p.add_argument("--quick", action="store_true", help="small models and few repeats (minutes on a CPU)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", type=int, default=threads, help="CPU threads (0: torch's default)")
    p.add_argument("--repeats", type=int, default=0, help="interleaved repeats (0: the mode's default)")


def setup(args) -> torch.device:
    """Apply --threads and resolve --device."""
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def autocast(device: torch.device, dtype: torch.dtype | None):
    """bf16 / fp16 autocast on ``device``, or a no-op context for fp32 (``dtype=None``)."""
    import contextlib

    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def training_step(
    model: torch.nn.Module,
    batch: int,
    shape: tuple[int, int, int] = (3, 32, 32),
    device: torch.device | str = "cpu",
    *,
    channels_last: bool = False,
    amp: torch.dtype | None = None,
    forward: Callable | None = None,
) -> Callable[[], None]:
    """A closure running one training step (forward, epsilon MSE, backward, AdamW) on fixed random data.

    ``forward(x, t)`` replaces ``model(x, t)`` (a compiled model, a wrapper); the optimizer always
    holds ``model``'s parameters.
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    x, noise = torch.randn(batch, *shape, generator=gen), torch.randn(batch, *shape, generator=gen)
    t = torch.randint(0, 1000, (batch,), generator=gen).float()
    model.to(device).train()
    x, noise, t = x.to(device), noise.to(device), t.to(device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
        x, noise = (v.contiguous(memory_format=torch.channels_last) for v in (x, noise))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fwd = model if forward is None else forward

    def step() -> None:
        with autocast(device, amp):
            pred = fwd(x, t)
        loss = (pred.float() - noise).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def noise_floor(medians: dict[str, float], a: str, b: str) -> float:
    """|ratio - 1| of two entries that run the same code: how far apart identical work is timed."""
    return abs(medians[b] / medians[a] - 1.0)


def result_name(stem: str, device: torch.device, quick: bool, tag: str = "") -> str:
    """``stem[_cuda][_tag][_quick]``: CPU results keep the plain name, GPU ones never overwrite them."""
    dev = "" if device.type == "cpu" else f"_{device.type}"
    return stem + dev + (f"_{tag}" if tag else "") + ("_quick" if quick else "")
