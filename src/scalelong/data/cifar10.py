"""CIFAR-10 (``data.name=cifar10``) from its python batches, kept in memory as uint8.

The batches are pickles; they are read by :class:`CifarUnpickler`, which rebuilds dicts, lists,
bytes and uint8 arrays and refuses anything else, so a crafted file cannot run code.
"""

from __future__ import annotations

import codecs
import io
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np

from scalelong.data.pixels import UInt8Images
from scalelong.data.sources import data_dir
from scalelong.errors import ScaleLongError

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
    root = data_dir(path, "CIFAR-10", CIFAR10_LAYOUT)
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
