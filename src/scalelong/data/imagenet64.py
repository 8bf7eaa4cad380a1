"""Class-conditional ImageNet 64 (``data.name=imagenet64``): the downsampled npz batches,
memory-mapped, or an image folder with one subfolder per class."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from scalelong.data.array_files import npz_member
from scalelong.data.image_files import ImageFiles, centre_crop_resize, image_paths
from scalelong.data.pixels import UInt8Images
from scalelong.data.sources import data_dir
from scalelong.errors import ScaleLongError

IMAGENET64_LAYOUT = (
    "downsampled ImageNet 64x64 train_data_batch_1..10(.npz) and val_data(.npz) with keys data "
    "(N, 12288) uint8 and labels 1..1000, or an image folder with one subfolder per class"
)


def _imagenet_npz(root: Path, split: str) -> UInt8Images | None:
    stems = [f"train_data_batch_{i}" for i in range(1, 11)] if split == "train" else ["val_data"]
    found = [root / s if (root / s).is_file() else root / f"{s}.npz" for s in stems]
    found = [f for f in found if f.is_file()]
    if not found:
        return None
    arrays, labels = [], []
    for file in found:
        try:
            data = npz_member(file, "data")
            y = np.asarray(np.load(file)["labels"], dtype=np.int64)
        except Exception as e:  # not a zip, missing keys, truncated
            raise ScaleLongError(f"ImageNet 64 file {file} is corrupt or not an npz batch ({e!r})") from None
        bad_labels = len(y) != len(data) or y.min() < 1 or y.max() > 1000
        if data.ndim != 2 or data.shape[1] != 3 * 64 * 64 or bad_labels:
            raise ScaleLongError(
                f"ImageNet 64 file {file} has data {data.shape} and labels in [{y.min()}, {y.max()}]; "
                "expected data (N, 12288) and labels 1..1000"
            )
        arrays.append(data)
        labels.append(y - 1)  # the files count classes from 1
    ds = UInt8Images(arrays, np.concatenate(labels), (3, 64, 64))
    ds.description = f"ImageNet 64 {split} from {len(found)} npz batches in {root}: {len(ds):,} images"
    return ds


def load_imagenet64(
    path: str | None, split: str = "train", resolution: int = 0, channels: int = 3
) -> Dataset:
    """Class-conditional ImageNet 64 from npz batches (RGB) or from a folder of class subfolders."""
    root = data_dir(path, "ImageNet 64", IMAGENET64_LAYOUT)
    if split not in ("train", "test", "val"):
        raise ScaleLongError(f"ImageNet 64 has splits train and val, not data.split={split!r}")
    ds = _imagenet_npz(root, split)
    if ds is not None:
        if channels != 3:
            raise ScaleLongError(
                f"data.channels={channels}: the ImageNet 64 npz batches in {root} hold RGB images; "
                "use data.channels=3"
            )
        return ds
    folder = root / split if (root / split).is_dir() else root
    classes = sorted(p for p in folder.iterdir() if p.is_dir())
    files, labels = [], []
    for label, c in enumerate(classes):
        class_files = image_paths(c)
        files += class_files
        labels += [label] * len(class_files)
    if not files:
        raise ScaleLongError(f"ImageNet 64 not found in {root}: expected {IMAGENET64_LAYOUT}")
    side = resolution or 64
    desc = f"ImageNet {side} {split} from {folder}: {len(files):,} images, {len(classes)} classes"
    return ImageFiles(files, labels, centre_crop_resize(side), desc, channels)
