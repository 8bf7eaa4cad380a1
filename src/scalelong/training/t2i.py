"""Text-to-image in latent space: the MS-COCO recipe of U-ViT (Bao et al., CVPR 2023).

Images are encoded once by the Stable Diffusion KL-f8 autoencoder (latents times 0.23010) and
captions by the CLIP ViT-L/14 text encoder (77 tokens x 768); both are stored in safetensors
shards that training reads. The autoencoder and text encoder come from the Hugging Face hub on
a connected machine or from local folders; offline without a local folder, loading fails with
one line saying what to download.

Shard layout of a feature folder (read back by :class:`scalelong.data.LatentCaptions`)::

    meta.json                    counts, shapes, the shard files, the settings they were made with
    null_context.safetensors     {"context": (77, D)} the empty caption, for guidance and dropout
    shard-00000.safetensors      {"latents": (n, 4, h, w), "context": (m, 77, D), "image_index": (m,)}
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from scalelong.data import from_uint8
from scalelong.data.latent_captions import META_FILE, read_features_meta
from scalelong.errors import ScaleLongError, first_line
from scalelong.runlog.records import write_text_atomic
from scalelong.sampling import get_sampler, model_eps_fn, randn

DEFAULT_AUTOENCODER = "CompVis/stable-diffusion-v1-4"  # its "vae" subfolder is SD's KL-f8
DEFAULT_TEXT_ENCODER = "openai/clip-vit-large-patch14"
LATENT_SCALE = 0.23010  # U-ViT's scale of the SD KL-f8 latents (unit variance on COCO)
CONTEXT_TOKENS = 77


def _needs(package: str, extra: str = "t2i"):
    try:
        return __import__(package)
    except ImportError as e:
        raise ScaleLongError(f"text-to-image needs {package}: pip install 'scalelong[{extra}]'") from e


def _load_pretrained(cls, name: str, what: str, subfolder: str | None = None):
    """``cls.from_pretrained`` with a local folder or a hub id; offline failure is one clear line."""
    local = Path(name).expanduser()
    kwargs = {"subfolder": subfolder} if subfolder else {}
    if local.exists():
        if subfolder and not (local / subfolder).is_dir():
            kwargs = {}  # a folder that already is the component itself
        try:
            return cls.from_pretrained(str(local), **kwargs)
        except (OSError, ValueError) as e:
            raise ScaleLongError(f"cannot load the {what} from {local}: {e}") from e
    try:
        return cls.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:
        raise ScaleLongError(
            f"cannot load the {what} {name!r}: not a local folder and the hub cannot be reached; on a "
            f"connected machine run `huggingface-cli download {name}` (or save_pretrained it) and pass "
            "the local folder instead"
        ) from e


def load_autoencoder(name: str = DEFAULT_AUTOENCODER):
    """The KL-f8 autoencoder (diffusers ``AutoencoderKL``) from a hub id or a local folder."""
    _needs("diffusers")
    from diffusers import AutoencoderKL

    return _load_pretrained(AutoencoderKL, name, "autoencoder", subfolder="vae").eval().requires_grad_(False)


def load_text_encoder(name: str = DEFAULT_TEXT_ENCODER):
    """(tokenizer, CLIPTextModel) from a hub id or a local folder (tokenizer files beside it)."""
    _needs("transformers")
    from transformers import CLIPTextModel, CLIPTokenizer

    tokenizer = _load_pretrained(CLIPTokenizer, name, "CLIP tokenizer", subfolder="tokenizer")
    model = _load_pretrained(CLIPTextModel, name, "CLIP text encoder", subfolder="text_encoder")
    return tokenizer, model.eval().requires_grad_(False)


@torch.no_grad()
def encode_prompts(prompts: Sequence[str], tokenizer, text_encoder, device="cpu") -> torch.Tensor:
    """Captions -> CLIP token embeddings (B, 77, D), as U-ViT feeds them."""
    ids = tokenizer(
        list(prompts), padding="max_length", max_length=CONTEXT_TOKENS, truncation=True, return_tensors="pt"
    ).input_ids.to(device)
    return text_encoder(ids).last_hidden_state.float()


@torch.no_grad()
def encode_images(images: torch.Tensor, autoencoder, scale: float = LATENT_SCALE) -> torch.Tensor:
    """Images in [-1, 1] (B, 3, H, W) -> scaled posterior means (B, 4, H/8, W/8)."""
    return autoencoder.encode(images).latent_dist.mean.float() * scale


@torch.no_grad()
def decode_latents(latents: torch.Tensor, autoencoder, scale: float = LATENT_SCALE) -> torch.Tensor:
    """Scaled latents -> images in [-1, 1]."""
    return autoencoder.decode(latents / scale).sample.float().clamp(-1, 1)


def center_crop(image, resolution: int) -> np.ndarray:
    """Resize the shorter side to ``resolution`` (bicubic) and take the centre square: (H, W, 3) uint8."""
    from PIL import Image

    scale = resolution / min(image.size)
    image = image.resize(
        (max(resolution, round(image.size[0] * scale)), max(resolution, round(image.size[1] * scale))),
        Image.BICUBIC,
    )
    left, top = (image.size[0] - resolution) // 2, (image.size[1] - resolution) // 2
    return np.asarray(image.crop((left, top, left + resolution, top + resolution)))


def read_coco_captions(captions_json: Path) -> list[tuple[str, list[str]]]:
    """(file_name, captions) per image of an MS-COCO captions file, in file order."""
    if not captions_json.is_file():
        raise ScaleLongError(
            f"captions file not found: {captions_json}; expected an MS-COCO captions JSON "
            "(e.g. annotations/captions_train2014.json)"
        )
    try:
        data = json.loads(captions_json.read_text())
        names = {img["id"]: img["file_name"] for img in data["images"]}
        captions: dict[int, list[str]] = {i: [] for i in names}
        for ann in data["annotations"]:
            captions[ann["image_id"]].append(ann["caption"].strip())
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ScaleLongError(
            f"{captions_json} is not an MS-COCO captions file (needs 'images' with id/file_name and "
            f"'annotations' with image_id/caption): {e!r}"
        ) from e
    return [(names[i], caps) for i, caps in captions.items() if caps]


def _load_rgb(path: Path):
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except FileNotFoundError as e:
        raise ScaleLongError(f"image listed in the captions file is missing: {path}") from e
    except (UnidentifiedImageError, OSError) as e:
        raise ScaleLongError(f"corrupt image file: {path} ({e})") from e


def _save_atomic(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    tmp = path.with_name(f".tmp-{path.name}")
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp)
    os.replace(tmp, path)


def _weights_sha256(model) -> str:
    """sha256 of a model's state dict (names, dtypes, shapes, bytes): which encoder made a folder."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name} {t.dtype} {tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy())
    return h.hexdigest()


# What a shard's content depends on (batch size and device do not), as a refusal names each one.
_SETTING_NAMES = {
    "shard_size": "--shard-size",
    "resolution": "--resolution",
    "latent_scale": "latent scale",
    "captions_sha256": "captions file content",
    "autoencoder_sha256": "autoencoder weights",
    "text_encoder_sha256": "text encoder weights",
}


def _check_resumable(out_dir: Path, settings: dict) -> None:
    """Refuse a folder whose shards were made with other settings (or with unknown ones): skipping
    them would mix two sets of shards, duplicating or dropping images or mixing latent shapes."""
    if not (out_dir / META_FILE).is_file():
        if any(out_dir.glob("shard-*.safetensors")):
            raise ScaleLongError(
                f"{out_dir} holds shard files but no meta.json saying how they were made; extract into a "
                "new --out folder (or delete those shards)"
            )
        return
    meta = read_features_meta(out_dir)
    if "settings" not in meta:
        raise ScaleLongError(
            f"{out_dir} was extracted by an older scalelong that recorded no settings: it trains as it is; "
            "to extract again use a new --out folder"
        )
    old = meta["settings"] if isinstance(meta["settings"], dict) else {}
    diffs = [
        f"{label} {old.get(k)} there, {settings[k]} now" if not k.endswith("_sha256") else f"{label} differ"
        for k, label in _SETTING_NAMES.items()
        if old.get(k) != settings[k]
    ]
    if diffs:
        raise ScaleLongError(
            f"{out_dir} holds features extracted with other settings ({'; '.join(diffs)}): pass the same "
            "settings to resume it, or extract into a new --out folder"
        )


def extract_features(
    image_dir: Path,
    captions_json: Path,
    out_dir: Path,
    autoencoder,
    tokenizer,
    text_encoder,
    *,
    resolution: int = 256,
    scale: float = LATENT_SCALE,
    shard_size: int = 1024,
    batch_size: int = 16,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> dict:
    """Encode an MS-COCO-style folder into latent + caption shards; returns the meta record.

    Resumable: meta.json, with the settings, is written before the first shard; a later call with
    the same settings (captions, encoder weights, resolution, shard size) keeps and skips the shards
    already written, one with other settings is refused.
    """
    from tqdm import tqdm

    image_dir, out_dir = Path(image_dir), Path(out_dir)
    if not image_dir.is_dir():
        raise ScaleLongError(f"image folder not found: {image_dir}")
    items = read_coco_captions(Path(captions_json))
    settings = {
        "shard_size": shard_size,
        "resolution": resolution,
        "latent_scale": scale,
        "captions_sha256": hashlib.sha256(json.dumps(items).encode()).hexdigest(),  # what is encoded
        "autoencoder_sha256": _weights_sha256(autoencoder),
        "text_encoder_sha256": _weights_sha256(text_encoder),
    }
    _check_resumable(out_dir, settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    autoencoder.to(device)
    text_encoder.to(device)
    null = encode_prompts([""], tokenizer, text_encoder, device)[0].cpu()
    _save_atomic({"context": null.half()}, out_dir / "null_context.safetensors")
    num_shards = (len(items) + shard_size - 1) // shard_size
    shard_files = [f"shard-{s:05d}.safetensors" for s in range(num_shards)]
    meta = {
        "images": len(items),
        "captions": sum(len(c) for _, c in items),
        "shards": num_shards,
        "shard_files": shard_files,  # what LatentCaptions reads: never a stray shard-* of another run
        "resolution": resolution,
        "latent_scale": scale,
        "latent_shape": [4, resolution // 8, resolution // 8],
        "context_dim": int(null.shape[-1]),
        "captions_file": str(captions_json),
        "settings": settings,
    }
    write_text_atomic(out_dir / META_FILE, json.dumps(meta, indent=1))
    for s in tqdm(range(num_shards), disable=not progress, desc="shards"):
        path = out_dir / shard_files[s]
        if path.is_file():
            continue
        chunk = items[s * shard_size : (s + 1) * shard_size]
        latents, contexts, image_index = [], [], []
        for b in range(0, len(chunk), batch_size):
            batch = chunk[b : b + batch_size]
            pixels = np.stack([center_crop(_load_rgb(image_dir / name), resolution) for name, _ in batch])
            x = from_uint8(pixels.transpose(0, 3, 1, 2)).to(device)
            latents.append(encode_images(x, autoencoder, scale).cpu())
            for j, (_, caps) in enumerate(batch):
                contexts.append(encode_prompts(caps, tokenizer, text_encoder, device).cpu())
                image_index += [b + j] * len(caps)
        _save_atomic(
            {
                "latents": torch.cat(latents),
                "context": torch.cat(contexts).half(),  # fp16 halves the largest part of the shards
                "image_index": torch.tensor(image_index, dtype=torch.long),
            },
            path,
        )
    return meta


def guided_eps_fn(net, schedule, scale: float, cond: dict, uncond: dict):
    """Classifier-free guidance (Ho & Salimans 2022): eps_u + scale (eps_c - eps_u).

    Scale 1 is exactly the conditional prediction and scale 0 exactly the unconditional one;
    otherwise both run as one doubled batch.
    """
    if scale == 1.0:
        return model_eps_fn(net, schedule, **cond)
    if scale == 0.0:
        return model_eps_fn(net, schedule, **uncond)

    def eps_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        both = {k: torch.cat([cond[k], uncond[k]]) for k in cond}
        eps = model_eps_fn(net, schedule, **both)(torch.cat([x, x]), torch.cat([t, t]))
        eps_c, eps_u = eps.chunk(2)
        return eps_u + scale * (eps_c - eps_u)

    return eps_fn


@torch.no_grad()
def generate_from_context(
    net,
    schedule,
    sampler: str,
    steps: int,
    seeds: Sequence[int],
    context: torch.Tensor,
    null_context: torch.Tensor,
    guidance_scale: float,
    latent_shape: Sequence[int],
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Latents for caption embeddings ``context`` (B, 77, D), one seed per sample, with guidance."""
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    x = randn((len(gens), *latent_shape), gens, device)
    cond = {"context": context.to(device)}
    uncond = {"context": null_context.to(device).expand_as(cond["context"])}
    eps_fn = guided_eps_fn(net, schedule, guidance_scale, cond, uncond)
    return get_sampler(sampler)(eps_fn, schedule, x, steps, gens)


def read_prompts(prompts: Sequence[str] | None, prompts_file: str | Path | None) -> list[str]:
    """Prompts from the command line and/or a file (UTF-8, one per line, blank lines skipped)."""
    out = list(prompts or [])
    if prompts_file is not None:
        path = Path(prompts_file)
        if not path.is_file():
            raise ScaleLongError(f"prompts file not found: {path}")
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as e:
            raise ScaleLongError(
                f"cannot read the prompts file {path} ({first_line(e, name=True)}): it must be UTF-8 text, "
                "one prompt per line"
            ) from None
        out += [line.strip() for line in text.splitlines() if line.strip()]
    if not out:
        raise ScaleLongError("no prompt given: pass --prompt TEXT (repeatable) or --prompts-file FILE")
    return out
