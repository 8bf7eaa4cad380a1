"""Metrics of a run: ``metrics.jsonl`` always, TensorBoard and Weights & Biases when available.

One JSON object per logged step in ``metrics.jsonl``; the same numbers go to TensorBoard
(``<run>/tb``) when ``tensorboard`` is installed and to W&B when ``wandb`` is installed and
``train.wandb`` is on. A missing optional backend costs one warning line, never the run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch


def _jsonable(value: float) -> float | str:
    # JSON has no NaN or infinity; write them as strings so they stay visible.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLog:
    """Appends records to ``metrics.jsonl``; ``read`` gives them back."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop records beyond ``step``: a resumed run rewrites them."""
        if self.path.is_file():
            kept = [r for r in self.read(self.path) if r.get("step", 0) <= step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    @staticmethod
    def read(path: Path) -> list[dict]:
        if not path.is_file():
            return []
        records = []
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
        return records


class Tracker:
    """Every metrics sink of a run. Create it on the main process only.

    ``start_step`` > 0 means a resumed run: records after it are dropped from ``metrics.jsonl``
    and purged from TensorBoard, so the logs read as one uninterrupted run.
    """

    def __init__(
        self,
        run_dir: Path,
        config: dict,
        start_step: int = 0,
        tensorboard: bool = True,
        wandb: bool = False,
    ):
        self.metrics = MetricsLog(run_dir / "metrics.jsonl")
        self.metrics.truncate_after(start_step)
        self.tb = self._tensorboard(run_dir / "tb", start_step) if tensorboard else None
        self.wandb = self._wandb(run_dir, config) if wandb else None

    @staticmethod
    def _tensorboard(log_dir: Path, start_step: int):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            print(
                "warning: tensorboard is not installed; skipping TensorBoard logs (pip install tensorboard)"
            )
            return None
        return SummaryWriter(str(log_dir), purge_step=start_step + 1 if start_step else None)

    @staticmethod
    def _wandb(run_dir: Path, config: dict):
        try:
            import wandb
        except ImportError:
            print("warning: train.wandb is on but wandb is not installed; skipping W&B (pip install wandb)")
            return None
        return wandb.init(
            project="scalelong", name=run_dir.name, dir=str(run_dir), config=config, resume="allow"
        )

    def log(self, record: dict) -> None:
        """Write one record; ``record["step"]`` is the step it belongs to."""
        self.metrics.write(record)
        step = record["step"]
        numbers = {k: v for k, v in record.items() if k != "step" and isinstance(v, int | float)}
        if self.tb is not None:
            for key, value in numbers.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)

    def images(self, tag: str, grid: torch.Tensor, step: int) -> None:
        """A (3, H, W) image grid in [0, 1]."""
        if self.tb is not None:
            self.tb.add_image(tag, grid, step)
        if self.wandb is not None:
            import wandb

            self.wandb.log({tag: wandb.Image(grid.permute(1, 2, 0).numpy())}, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
