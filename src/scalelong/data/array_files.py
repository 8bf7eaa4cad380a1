"""uint8 images stored as arrays (``data.name=array``): a ``.npy``, ``.npz`` or ``.safetensors``
file, or a folder of such files, read by :func:`load_array` into :class:`~scalelong.data.pixels.UInt8Images`.

Each file is memory-mapped where it stores its array plainly (:func:`npz_member`, which the
ImageNet 64 batches are read with too); its header, dtype, layout and size are checked, and its
first and last image read, before a run starts.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from scalelong.data.pixels import UInt8Images
from scalelong.errors import ScaleLongError

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
            return npz_member(file, _image_key(names, file))
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


def npz_member(path: Path, key: str) -> np.ndarray:
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
