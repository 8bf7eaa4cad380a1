"""Images decoded from files on access: :class:`ImageFiles`, as RGB or grey, with
:func:`centre_crop_resize`, the transform to a square of the final size, and :func:`image_paths`,
the image files under a folder."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from scalelong.data.pixels import from_uint8
from scalelong.errors import ScaleLongError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
FILE_CHANNELS = {3: "RGB", 1: "L"}  # channels of an image read from a file -> PIL mode


def _pil_mode(channels: int) -> str:
    if channels not in FILE_CHANNELS:
        raise ScaleLongError(f"data.channels={channels}: images are read as 3 (RGB) or 1 (grey) channels")
    return FILE_CHANNELS[channels]


class ImageFiles(Dataset):
    """Images decoded from files on access, as RGB or grey (``channels`` 3 or 1); ``transform`` maps
    a PIL image to the final size.

    :func:`load_dataset` decodes every file once (:meth:`check`), so a damaged image stops a run
    before it starts, not hours into it.
    """

    def __init__(
        self,
        files: list[Path],
        labels: list[int],
        transform: Callable,
        description: str = "",
        channels: int = 3,
    ):
        self.files, self.transform, self.description = files, transform, description
        self.labels = torch.tensor(labels, dtype=torch.long)
        self.mode = _pil_mode(channels)

    def check(self) -> None:
        """Decode and transform every image (on a few threads); raise one ScaleLongError naming the
        first damaged file and how many there are."""
        from concurrent.futures import ThreadPoolExecutor

        def problem(i: int) -> str | None:
            try:
                self[i]
            except ScaleLongError as e:
                return str(e)
            return None

        threads = min(8, os.cpu_count() or 1)
        with ThreadPoolExecutor(threads) as pool:
            problems = [p for p in pool.map(problem, range(len(self))) if p is not None]
        if problems:
            more = f"; {len(problems) - 1} more of the {len(self):,} images fail" if len(problems) > 1 else ""
            raise ScaleLongError(
                f"{problems[0]}{more}; remove or replace them (every image is checked first)"
            )

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        path = self.files[i]
        try:
            with Image.open(path) as img:
                img = self.transform(img.convert(self.mode), path)
                pixels = np.asarray(img, dtype=np.uint8).reshape(img.size[1], img.size[0], -1)
                pixels = pixels.transpose(2, 0, 1)  # (C, H, W)
        except ScaleLongError:
            raise
        except (OSError, ValueError, SyntaxError) as e:  # PIL's errors for damaged files
            raise ScaleLongError(f"corrupt or unreadable image {path} ({e})") from None
        return from_uint8(pixels), self.labels[i]


def centre_crop_resize(side: int) -> Callable:
    """Centre square crop, then an antialiased resize to ``side`` x ``side``."""

    def transform(img, path):
        from PIL import Image

        w, h = img.size
        s = min(w, h)
        img = img.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s))
        return img if s == side else img.resize((side, side), Image.BICUBIC, reducing_gap=None)

    return transform


def image_paths(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
