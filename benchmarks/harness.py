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
    """Median seconds per call of each function, timed round-robin so drift hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def ratios(medians: dict[str, float], baseline: str) -> dict[str, float]:
    return {name: t / medians[baseline] for name, t in medians.items()}


def machine() -> dict:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
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
