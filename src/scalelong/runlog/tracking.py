"""Where a run's metrics go: its ``metrics.jsonl`` always, TensorBoard and Weights & Biases
when available.

One JSON object per logged step in the folder's metrics log
(:class:`scalelong.runlog.records.MetricsLog`); the same numbers go to TensorBoard (``<folder>/tb``)
when ``tensorboard`` is installed and to W&B when ``wandb`` is installed and asked for. A missing
optional backend costs one warning, never the run. Used by the trainer and by
:class:`scalelong.runlog.RunLog` alike, so it knows a folder, not a trainer.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from scalelong.runlog.lock import Warn, warn_user
from scalelong.runlog.records import METRICS_FILE, TB_DIR, MetricsLog


class Tracker:
    """Every metrics sink of a run folder. Create it on the main process only.

    ``start_step`` > 0 means a resumed run: records after it are dropped from ``metrics.jsonl``
    and purged from TensorBoard, so the logs read as one uninterrupted run. ``warn`` reports a
    missing backend (a :class:`UserWarning` by default; the trainer prints it).
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        config: dict,
        start_step: int = 0,
        tensorboard: bool = True,
        wandb: bool = False,
        warn: Warn = warn_user,
    ):
        folder = Path(folder)
        self.warn = warn
        self.metrics = MetricsLog(folder / METRICS_FILE, warn)
        self.metrics.truncate_after(start_step)
        self.tb = self._tensorboard(folder / TB_DIR, start_step) if tensorboard else None
        self.wandb = self._wandb(folder, config) if wandb else None

    def _tensorboard(self, log_dir: Path, start_step: int):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            self.warn(
                "warning: tensorboard is not installed; skipping TensorBoard logs (pip install tensorboard)"
            )
            return None
        # Events after the start step (left by an earlier attempt) are purged: one curve per run.
        return SummaryWriter(str(log_dir), purge_step=start_step + 1)

    def _wandb(self, folder: Path, config: dict):
        try:
            import wandb
        except ImportError:
            self.warn(
                "warning: W&B logging is on but wandb is not installed; skipping W&B (pip install wandb)"
            )
            return None
        return wandb.init(
            project="scalelong", name=folder.name, dir=str(folder), config=config, resume="allow"
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
