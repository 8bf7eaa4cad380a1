"""What a training loop writes into its run folder, without the trainer: :class:`RunLog`
(:mod:`.folder`), built on the metrics log and atomic writes (:mod:`.records`), the writer's lock
(:mod:`.lock`), TensorBoard events (:mod:`.tracking`) and each run's provenance
(:mod:`.provenance`). ``RunLog`` is imported on first use, so the configuration reads and writes
records through this package without loading torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scalelong.runlog.folder import RunLog

__all__ = ["RunLog"]


def __getattr__(name: str):
    if name != "RunLog":
        raise AttributeError(f"module 'scalelong.runlog' has no attribute {name!r}")
    from scalelong.runlog.folder import RunLog

    globals()["RunLog"] = RunLog
    return RunLog
