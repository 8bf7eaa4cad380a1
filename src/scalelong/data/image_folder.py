"""A folder of your own images (``data.name=folder``): :func:`load_folder`, every image under it,
centre-cropped and resized to ``data.resolution``, or (``data.resolution=0``) all of the first
image's size."""

from __future__ import annotations

from collections.abc import Callable

from scalelong.data.image_files import IMAGE_SUFFIXES, ImageFiles, centre_crop_resize, image_paths
from scalelong.data.sources import data_dir
from scalelong.errors import ScaleLongError


def _same_size(size: tuple[int, int]) -> Callable:
    def transform(img, path):
        if img.size != size:
            raise ScaleLongError(
                f"image {path} is {img.size[0]}x{img.size[1]} but the folder's first image is "
                f"{size[0]}x{size[1]}; set data.resolution to resize them all"
            )
        return img

    return transform


def load_folder(path: str | None, resolution: int = 0, channels: int = 3) -> ImageFiles:
    """Every image under ``path`` (recursively, sorted by path), label 0, as RGB or grey
    (``channels`` 3 or 1). Any other file but a hidden one (``.name``) is an error: a folder that
    holds something else is probably not the folder meant."""
    layout = "a folder of images (.png, .jpg, ...; subfolders are searched)"
    root = data_dir(path, "the image folder", layout)
    files = image_paths(root)
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
        transform = centre_crop_resize(resolution)
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
