"""CelebA at 64x64 (``data.name=celeba64``) from the aligned 178x218 images, with the U-ViT
preprocessing: crop the 128x128 box around centre (89, 121), resize to 64; the split is read from
``list_eval_partition.txt``."""

from __future__ import annotations

from scalelong.data.image_files import IMAGE_SUFFIXES, ImageFiles
from scalelong.data.sources import data_dir
from scalelong.errors import ScaleLongError

CELEBA_BOX = (25, 57, 153, 185)  # (left, top, right, bottom): 128x128 around centre (89, 121)


def _celeba_transform(img, path):
    from PIL import Image

    if img.size != (178, 218):
        raise ScaleLongError(
            f"CelebA image {path} is {img.size[0]}x{img.size[1]}, not the aligned 178x218 "
            "(use img_align_celeba, not the in-the-wild images)"
        )
    return img.crop(CELEBA_BOX).resize((64, 64), Image.BILINEAR)


CELEBA_LAYOUT = (
    "the aligned CelebA images (img_align_celeba/*.jpg, 178x218) in it or in its img_align_celeba "
    "folder, and list_eval_partition.txt beside them for data.split=train|valid|test"
)


def load_celeba64(path: str | None, split: str = "train", channels: int = 3) -> ImageFiles:
    """CelebA at 64x64 with the U-ViT preprocessing (crop box (25, 57, 153, 185), resize to 64)."""
    root = data_dir(path, "CelebA", CELEBA_LAYOUT)
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
