"""The [-1, 1] pixel convention and the in-memory image sets.

:func:`from_uint8` and :func:`to_uint8` convert between stored pixels and the [-1, 1] convention.
:class:`TensorImages` holds images already in [-1, 1] as one tensor; :class:`UInt8Images` holds
uint8 rows (in memory or memory-mapped) and converts an image when it is read.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset


def from_uint8(pixels: np.ndarray) -> torch.Tensor:
    """uint8 pixels -> float32 in [-1, 1], same shape, in a new C-contiguous tensor of its own.

    ``pixels`` is often a read-only view (a row of a memory-mapped batch, a decoded PIL image,
    possibly transposed): the conversion to float is the one copy, made in NumPy, so no tensor
    ever wraps that buffer and the result is scaled in place.
    """
    return torch.from_numpy(np.array(pixels, dtype=np.float32, order="C")).div_(127.5).sub_(1.0)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Images in [-1, 1] -> the uint8 pixels a PNG of them holds, same shape and device."""
    return ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


class TensorImages(Dataset):
    """An in-memory image set: images (N, C, H, W) in [-1, 1] and labels (N,)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor | None = None):
        self.images = images
        self.labels = labels if labels is not None else torch.zeros(len(images), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]


class UInt8Images(Dataset):
    """Images stored as uint8 (C, H, W) rows in one or more arrays (in memory or memory-mapped).

    ``arrays`` hold (n_k, C*H*W) or (n_k, C, H, W); indices run through them in order. uint8 keeps
    CIFAR-10 at 150 MB and lets ImageNet 64 stay memory-mapped in the page cache shared by processes.
    """

    def __init__(
        self,
        arrays: list[np.ndarray],
        labels: np.ndarray,
        shape: tuple[int, int, int],
        channels_last: bool = False,
    ):
        self.arrays, self.shape, self.channels_last = arrays, shape, channels_last  # rows (H, W, C)
        self.labels = torch.from_numpy(np.array(labels, dtype=np.int64))  # a copy: the dataset's own
        self.offsets = np.cumsum([0] + [len(a) for a in arrays])
        self.description = ""

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = int(np.searchsorted(self.offsets, i, side="right")) - 1
        pixels = np.asarray(self.arrays[k][i - self.offsets[k]])
        pixels = pixels.transpose(2, 0, 1) if self.channels_last else pixels.reshape(self.shape)
        return from_uint8(pixels), self.labels[i]
