"""The latent + caption shards of ``scalelong extract-features`` (``data.name=coco_latents``,
written by :mod:`scalelong.training.t2i`) as a dataset: :class:`LatentCaptions`."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from scalelong.errors import ScaleLongError


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
