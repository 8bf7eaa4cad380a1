"""Where a run's metrics go: its ``metrics.jsonl`` always, TensorBoard and Weights & Biases
when available.

One JSON object per logged step in the run's metrics log (:class:`scalelong.runs.MetricsLog`);
the same numbers go to TensorBoard (``<run>/tb``) when ``tensorboard`` is installed and to W&B
when ``wandb`` is installed and ``train.wandb`` is on. A missing optional backend costs one
warning line, never the run.
"""

from __future__ import annotations

from pathlib import Path

import torch

from scalelong.runs import RunDir


class Tracker:
    """Every metrics sink of a run. Create it on the main process only.

    ``start_step`` > 0 means a resumed run: records after it are dropped from ``metrics.jsonl``
    and purged from TensorBoard, so the logs read as one uninterrupted run.
    """

    def __init__(
        self,
        run: RunDir,
        config: dict,
        start_step: int = 0,
        tensorboard: bool = True,
        wandb: bool = False,
    ):
        self.metrics = run.metrics_log
        self.metrics.truncate_after(start_step)
        self.tb = self._tensorboard(run.tb_dir, start_step) if tensorboard else None
        self.wandb = self._wandb(run, config) if wandb else None

    @staticmethod
    def _tensorboard(log_dir: Path, start_step: int):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            print(
                "warning: tensorboard is not installed; skipping TensorBoard logs (pip install tensorboard)"
            )
            return None
        # Events after the start step (left by an earlier attempt) are purged: one curve per run.
        return SummaryWriter(str(log_dir), purge_step=start_step + 1)

    @staticmethod
    def _wandb(run: RunDir, config: dict):
        try:
            import wandb
        except ImportError:
            print("warning: train.wandb is on but wandb is not installed; skipping W&B (pip install wandb)")
            return None
        return wandb.init(project="scalelong", name=run.name, dir=str(run), config=config, resume="allow")

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
