"""Where a dataset is read from and how it says so: :func:`data_dir` checks the ``data.path`` folder
(a wrong path names the layout expected there) and :func:`describe` gives the one line, a
dataset's ``description``, that says what was found where."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import Dataset

from scalelong.errors import ScaleLongError


def data_dir(path: str | None, what: str, layout: str) -> Path:
    if not path:
        raise ScaleLongError(f"{what} needs data.path; expected {layout}")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ScaleLongError(f"{what} not found: {root} is not a folder; expected {layout}")
    return root


def describe(dataset: Dataset) -> str:
    """One line: what was found where."""
    return getattr(dataset, "description", "") or f"{len(dataset):,} images"
