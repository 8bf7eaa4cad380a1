"""The deterministic, resumable batch order shared by all processes of a run: :class:`EpochBatches`,
and :func:`check_batches`, which says before a run starts whether the batch fits the data."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from scalelong.errors import ScaleLongError


def check_batches(num_items: int, global_batch: int, world_size: int = 1) -> None:
    """A ScaleLongError unless ``global_batch`` splits over the processes and the data fills it."""
    if global_batch % world_size:
        raise ScaleLongError(
            f"train.batch_size={global_batch} must be divisible by the {world_size} processes"
        )
    if num_items < global_batch:
        raise ScaleLongError(
            f"the dataset has {num_items:,} images, fewer than one batch of train.batch_size={global_batch}; "
            "lower train.batch_size"
        )


class EpochBatches(Sampler[list[int]]):
    """Deterministic, resumable batch order shared by all processes.

    Epoch ``e`` is a permutation drawn from ``seed + e``; global batch ``b`` of an epoch is
    ``perm[b * G : (b + 1) * G]`` (the tail is dropped) and process ``rank`` takes its slice of
    it. The batch at any step follows from the step alone, so resuming needs no sampler state
    and the global batch does not depend on the number of processes.
    """

    def __init__(
        self,
        num_items: int,
        global_batch: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        start_step: int = 0,
    ):
        check_batches(num_items, global_batch, world_size)
        self.num_items, self.global_batch, self.seed = num_items, global_batch, seed
        self.rank, self.world_size, self.start_step = rank, world_size, start_step
        self.batches_per_epoch = num_items // global_batch

    def epoch_permutation(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.num_items, generator=torch.Generator().manual_seed(self.seed + epoch))

    def __iter__(self) -> Iterator[list[int]]:
        local = self.global_batch // self.world_size
        step, perm_epoch, perm = self.start_step, -1, None
        while True:
            epoch, b = divmod(step, self.batches_per_epoch)
            if epoch != perm_epoch:
                perm, perm_epoch = self.epoch_permutation(epoch), epoch
            start = b * self.global_batch + self.rank * local
            yield perm[start : start + local].tolist()
            step += 1

    def __len__(self) -> int:  # endless; the trainer stops by step count
        return 2**62
