"""CLIP score of images with their captions (Hessel et al. 2021, as torchmetrics' ``CLIPScore``
defines it): 100 * max(cos(E_I, E_C), 0) of an image's and its caption's CLIP embeddings.

The CLIP model is a local folder of a Hugging Face ``CLIPModel`` with its ``CLIPProcessor``
(saved with ``save_pretrained``), read without the network. torchmetrics' ``CLIPScore`` does the
same computation but fetches its model by name and averages before clamping; here each image's
score is clamped, as the definition reads, and the scores are returned one per image so that a
caller splitting the images over processes can gather them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from scalelong.data import to_uint8
from scalelong.errors import ScaleLongError


def _not_clip(folder: Path, why: str) -> ScaleLongError:
    return ScaleLongError(
        f"{folder} is not a CLIP model folder ({why}): it needs a transformers CLIPModel and its "
        "CLIPProcessor saved there with save_pretrained"
    )


@contextlib.contextmanager
def _quiet_loading():
    """transformers' weight-loading progress bar off for the duration: a refusal stays one line."""
    from transformers.utils import logging

    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            logging.enable_progress_bar()


def _embedding(output) -> torch.Tensor:
    """The projected embedding of ``get_image_features`` / ``get_text_features``: a tensor before
    transformers 5, the ``pooler_output`` of a model output since."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class ClipScore:
    """Per-image CLIP scores with one CLIP model; ``load_clip_score`` builds it from a folder."""

    def __init__(self, model, processor, path: str | Path, device: torch.device | str = "cpu"):
        self.model = model.to(device).eval().requires_grad_(False)
        self.processor, self.path, self.device = processor, str(path), torch.device(device)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, captions: Sequence[str]) -> torch.Tensor:
        """The score (N,) of each of ``images`` (N, 3, H, W) in [-1, 1] with its caption."""
        if len(images) != len(captions):
            raise ValueError(f"{len(images)} images but {len(captions)} captions")
        # The pixels a PNG of each sample holds (HWC uint8): the processor then resizes, crops,
        # rescales and normalises them as CLIP was trained, which it cannot do from [-1, 1] floats.
        pixels = list(to_uint8(images).permute(0, 2, 3, 1).cpu().numpy())
        max_length = self.model.config.text_config.max_position_embeddings
        inputs = self.processor(
            text=list(captions), images=pixels, return_tensors="pt", padding=True, truncation=True,
            max_length=max_length,
        ).to(self.device)  # fmt: skip
        image = _embedding(self.model.get_image_features(pixel_values=inputs["pixel_values"]))
        text = _embedding(
            self.model.get_text_features(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
            )
        )
        cos = torch.nn.functional.cosine_similarity(image.float(), text.float(), dim=-1)
        return 100 * cos.clamp(min=0)


def load_clip_score(path: str | Path, device: torch.device | str = "cpu") -> ClipScore:
    """The CLIP model and processor saved in the local folder ``path``, read offline; a path that is
    not such a folder is one :class:`~scalelong.errors.ScaleLongError`."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ScaleLongError(
            f"CLIP model folder not found: {folder}; save a transformers CLIPModel and its CLIPProcessor "
            "there with save_pretrained (e.g. of openai/clip-vit-large-patch14 on a connected machine)"
        )
    try:
        from transformers import CLIPModel, CLIPProcessor
    except ImportError as e:
        raise ScaleLongError("the CLIP score needs transformers: pip install 'scalelong[t2i]'") from e
    try:
        kind = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise _not_clip(folder, f"no readable config.json: {e}") from None
    if kind != "clip":  # e.g. a CLIP text encoder alone, which CLIPModel would complete with random weights
        raise _not_clip(folder, f"its config.json has model_type {kind!r}, not 'clip'")
    try:  # the processor first: a folder without one fails before the weights are read
        processor = CLIPProcessor.from_pretrained(folder, local_files_only=True)
        with _quiet_loading():
            model, info = CLIPModel.from_pretrained(folder, local_files_only=True, output_loading_info=True)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise _not_clip(folder, str(e).splitlines()[0] if str(e) else repr(e)) from None
    if info["missing_keys"]:  # from_pretrained fills them with random weights: a meaningless score
        raise _not_clip(folder, f"{len(info['missing_keys'])} weights missing")
    return ClipScore(model, processor, folder, device)


__all__ = ["ClipScore", "load_clip_score"]
