"""A run folder of your own training loop, written as ``scalelong train`` writes its own.

It is made of the pieces the trainer's run directory (:class:`scalelong.training.runs.RunDir`) is made of,
with no trainer behind them: ``metrics.jsonl`` (:class:`scalelong.runlog.records.MetricsLog`), the
writer's ``.lock`` (:class:`scalelong.runlog.lock.FolderLock`) and TensorBoard events in ``tb/``
(:class:`scalelong.runlog.tracking.Tracker`). So ``scalelong analyze FOLDER`` reads what :class:`RunLog`
wrote as it reads a trained run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from scalelong.errors import ScaleLongError
from scalelong.runlog.lock import FolderLock, warn_user
from scalelong.runlog.records import CONFIG_FILE, METRICS_FILE, MetricsLog
from scalelong.runlog.tracking import Tracker


def _logged_value(key: str, value: object) -> object:
    """A value as the metrics log stores it: a number (0-d tensors read out) or a string."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ScaleLongError(f"metric {key!r} is a tensor of shape {tuple(value.shape)}; log one number")
        return value.item()
    if isinstance(value, (bool, int, float, str)):
        return value
    raise ScaleLongError(f"metric {key!r} is a {type(value).__name__}; log a number or a string")


class RunLog:
    """A run folder of your own training loop, written as ``scalelong train`` writes its own.

    ``RunLog("runs/my-unet")`` creates the folder if needed and holds its lock (``.lock``) until
    :meth:`close` or the end of the ``with`` block, so no second writer, and no ``scalelong train``,
    writes into it meanwhile. :meth:`write` appends one record per call to ``metrics.jsonl``
    (:class:`~scalelong.runlog.records.MetricsLog`, the trainer's format: ``step`` first, the training
    loss under ``loss``, the learning rate under ``lr``, non-finite numbers as ``"nan"`` /
    ``"inf"``), and with ``tensorboard`` to ``tb/`` too. ``scalelong analyze runs/my-unet`` then
    writes the plots, no ``config.yaml`` or checkpoint needed.

    Args:
        path: the run folder.
        start_step: the step a resumed loop continues after: records beyond it, left by an earlier
            attempt, are dropped (with a warning) so the log reads as one run; 0 starts afresh.
            Unreadable lines are moved to ``metrics.jsonl.bad`` (with a warning), never deleted.
        tensorboard: also write TensorBoard events into ``<path>/tb`` (needs tensorboard).

    See :mod:`scalelong.diagnostics` for a complete loop. Create it on the main process only.
    """

    def __init__(self, path: str | os.PathLike, start_step: int = 0, tensorboard: bool = False):
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ScaleLongError(f"start_step must be an integer >= 0, got {start_step!r}")
        self.path = Path(path)
        if (self.path / CONFIG_FILE).is_file():
            raise ScaleLongError(
                f"{self.path} holds a run of `scalelong train` ({CONFIG_FILE}); "
                "log your loop in another folder"
            )
        self._held = contextlib.ExitStack()
        self._held.enter_context(FolderLock(self.path).holding())  # the folder, the lock; until close()
        try:
            # Unreadable lines (record None) are the Tracker's to move aside and report, just below.
            lines = MetricsLog(self.path / METRICS_FILE).scan()
            stale = [r for _, _, r in lines if r is not None and r["step"] > start_step]
            if stale:
                warn_user(
                    f"{self.path / METRICS_FILE} held {len(stale)} record(s) after step {start_step} "
                    "from an earlier run; dropping them"
                )
            self.tracker: Tracker | None = Tracker(self.path, {}, start_step, tensorboard=tensorboard)
        except BaseException:
            self._held.close()
            raise

    def write(
        self,
        step: int,
        metrics: Mapping[str, object] | None = None,
        *,
        loss: float | torch.Tensor | None = None,
        lr: float | None = None,
    ) -> dict:
        """Append the record of ``step``: ``loss``, ``lr`` and ``metrics`` (e.g. what
        :meth:`Diagnostics.collect` returned); None values are left out. Returns the record."""
        if self.tracker is None:
            raise ScaleLongError(f"the RunLog of {self.path} is closed; open a new one to write")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ScaleLongError(f"step must be an integer >= 0, got {step!r}")
        metrics = dict(metrics or {})
        clash = sorted({"step", "loss", "lr"} & set(metrics))
        if "step" in clash or ("loss" in clash and loss is not None) or ("lr" in clash and lr is not None):
            raise ScaleLongError(f"{', '.join(clash)} given twice: pass them once, as arguments of write()")
        record: dict = {"step": step}
        for key, value in {"loss": loss, "lr": lr, **metrics}.items():
            if value is not None:
                record[key] = _logged_value(key, value)
        self.tracker.log(record)
        return record

    def close(self) -> None:
        """Flush TensorBoard and release the folder's lock (idempotent)."""
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
        self._held.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
