"""The images held out of training (``data.heldout``, for ``folder`` and ``array``): a fixed set
drawn by ``data.heldout_seed``, on which the per-noise-level x0 error is measured;
:func:`split_heldout` gives the training part, the held-out part or all of a dataset."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from scalelong.data.sources import describe
from scalelong.errors import ScaleLongError

HELDOUT_SPLITS = ("train", "heldout", "all")


class Part(Dataset):
    """The items ``indices`` of ``base``, in that order."""

    def __init__(self, base: Dataset, indices: list[int], description: str):
        self.base, self.indices, self.description = base, indices, description

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.base[self.indices[i]]


def split_heldout(dataset: Dataset, count: int, seed: int, split: str) -> Dataset:
    """The training part (``split="train"``: all but ``count`` images, in order), the held-out part
    (``"heldout"``: the ``count`` images a permutation drawn from ``seed`` puts first, in order) or
    ``"all"`` of ``dataset``. The held-out set depends on the seed and the dataset's size only,
    never on the run's seed, so every run of a study is measured on the same images."""
    if split not in HELDOUT_SPLITS:
        raise ScaleLongError(f"data.split={split!r}: choose one of {', '.join(HELDOUT_SPLITS)}")
    n, what = len(dataset), describe(dataset)
    if split == "all" or (count == 0 and split == "train"):
        return dataset
    if count == 0:
        raise ScaleLongError("data.split=heldout with data.heldout=0: no image is held out")
    if count >= n:
        raise ScaleLongError(
            f"data.heldout={count} would hold out every one of the {n:,} images ({what}); set data.heldout "
            "below that (it defaults to diagnostics.noise_levels), or 0 to measure on training images"
        )
    held = sorted(torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:count].tolist())
    if split == "heldout":
        return Part(dataset, held, f"{what}, the {count:,} held out (data.heldout_seed={seed})")
    kept = sorted(set(range(n)) - set(held))
    return Part(dataset, kept, f"{what}, {count:,} held out for the noise-level probe")
