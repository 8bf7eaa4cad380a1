"""The latent + caption shards of ``scalelong extract-features`` (``data.name=coco_latents``,
written by :mod:`scalelong.training.t2i`) as a dataset: :class:`LatentCaptions`."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.data import Dataset

from scalelong.errors import ScaleLongError, first_line

META_FILE = "meta.json"


def read_features_meta(path: Path) -> dict:
    """``meta.json`` of a feature folder; unreadable or not a JSON object raises a one-line error."""
    try:
        meta = json.loads((path / META_FILE).read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (OSError, UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise ScaleLongError(
            f"{path / META_FILE} is unreadable ({first_line(e)}); re-run `scalelong extract-features` "
            "into a new folder"
        ) from None
    return meta


def listed_shards(meta: dict, path: Path) -> list[str]:
    """The shard file names ``meta.json`` lists, in order."""
    files = meta.get("shard_files")
    if files is None and isinstance(meta.get("shards"), int) and not isinstance(meta["shards"], bool):
        # Folders written before meta.json listed its shards: that meta.json was written only after
        # the last shard, and its "shards" counts them, so they are shard-00000 .. shard-{count-1}.
        files = [f"shard-{s:05d}.safetensors" for s in range(meta["shards"])]
    if not isinstance(files, list) or not all(isinstance(f, str) and "/" not in f for f in files):
        raise ScaleLongError(
            f"{path / META_FILE} lists no shard files; re-run `scalelong extract-features` into a new folder"
        )
    return files


class LatentCaptions(Dataset):
    """Feature shards as a dataset of (latent (4, h, w), caption context (77, D)), one item per caption.

    Reads exactly the shards ``meta.json`` lists: any other ``shard-*`` file in the folder (a stray
    from another extraction) would duplicate images or mix latent shapes."""

    def __init__(self, path: str | Path):
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / META_FILE).is_file():
            raise ScaleLongError(
                f"no feature shards in {path}; expected meta.json, null_context.safetensors and "
                "shard-*.safetensors made by `scalelong extract-features`"
            )
        shards = listed_shards(read_features_meta(path), path)
        if not shards:
            raise ScaleLongError(f"no feature shards in {path}: its meta.json lists none")
        latents, contexts, index, offset = [], [], [], 0
        first = None
        for name in [*shards, "null_context.safetensors"]:
            if not (path / name).is_file():
                raise ScaleLongError(
                    f"{path / name} is missing from the feature folder: the extraction did not finish or "
                    "the file was deleted; re-run `scalelong extract-features` with the same settings"
                )
        for name in shards:
            try:
                data = load_file(path / name)
            except Exception as e:  # safetensors raises several types for a damaged file
                raise ScaleLongError(
                    f"feature shard {path / name} is corrupt ({first_line(e)}); delete it and re-extract"
                ) from None
            shape = {k: tuple(data[k].shape[1:]) for k in ("latents", "context")}
            if first is not None and shape != first:  # torch.cat would fail with a traceback
                raise ScaleLongError(
                    f"feature shard {path / name} holds shapes {shape}, the first shard {first}; "
                    "re-extract into a new folder"
                )
            first = shape
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
