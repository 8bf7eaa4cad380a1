"""Tiny, randomly initialised text encoder and autoencoder, and a fake MS-COCO folder (no download)."""

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

CHARS = [chr(c) for c in range(97, 123)] + list("0123456789 .,!?'")


def tiny_tokenizer(tmp: Path):
    from transformers import CLIPTokenizer

    vocab = {}
    for c in CHARS:
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (tmp / "vocab.json").write_text(json.dumps(vocab))
    (tmp / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(tmp / "vocab.json"), str(tmp / "merges.txt")), vocab


def tiny_text_encoder(tmp: Path, width: int = 32):
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    tokenizer, vocab = tiny_tokenizer(tmp)
    cfg = CLIPTextConfig(
        vocab_size=len(vocab),
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=77,
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|endoftext|>"],
    )
    return tokenizer, CLIPTextModel(cfg).eval()


def tiny_autoencoder():
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(4, 4, 4, 4),
        latent_channels=4,
        norm_num_groups=2,
        layers_per_block=1,
    ).eval()


def fake_coco(root: Path, n: int = 4, size: tuple[int, int] = (40, 30)) -> tuple[Path, Path]:
    images = root / "train2014"
    images.mkdir(parents=True)
    rng = np.random.default_rng(0)
    data = {"images": [], "annotations": []}
    for i in range(n):
        name = f"COCO_{i:03d}.jpg"
        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(images / name)
        data["images"].append({"id": 100 + i, "file_name": name})
        for j in range(2):
            data["annotations"].append({"image_id": 100 + i, "caption": f"a photo number {i} take {j}"})
    captions = root / "captions.json"
    captions.write_text(json.dumps(data))
    return images, captions


def save_tiny_t2i_run(cfg, tmp_path: Path) -> None:
    """A text-to-image run folder of ``cfg`` (config and a step-1 checkpoint of a fresh model) and the
    tiny text encoder and autoencoder it names, saved under ``tmp_path / "clip"`` and ``"vae"``."""
    from scalelong.training.build import build_model
    from scalelong.training.checkpoint import save_checkpoint
    from scalelong.training.config import config_to_dict, save_config

    cfg.run_dir.mkdir()
    save_config(cfg, cfg.run_dir / "config.yaml")
    model = build_model(cfg.model)
    save_checkpoint(cfg.run_dir / "checkpoints", 1, model, model, config_to_dict(cfg))
    save_tiny_encoders(tmp_path)


def save_tiny_encoders(tmp_path: Path) -> None:
    """The tiny text encoder and autoencoder as local folders ``tmp_path / "clip"`` and ``"vae"``."""
    tokenizer, text = tiny_text_encoder(tmp_path)
    tokenizer.save_pretrained(tmp_path / "clip")
    text.save_pretrained(tmp_path / "clip")
    tiny_autoencoder().save_pretrained(tmp_path / "vae")


def tiny_coco_features(root: Path, resolution: int = 32) -> Path:
    """The feature folder of a fake MS-COCO of 4 images (8 captions) under ``root``, encoded by the
    tiny encoders at ``resolution`` (latents of side resolution / 8): ``root / "feat"``."""
    from scalelong.training.t2i import extract_features

    images, captions = fake_coco(root)
    tokenizer, text = tiny_text_encoder(root)
    out = root / "feat"
    extract_features(
        images, captions, out, tiny_autoencoder(), tokenizer, text, resolution=resolution, progress=False
    )
    return out


def save_tiny_clip_model(folder: Path, image_size: int = 24, seed: int = 7) -> Path:
    """A tiny CLIP model (``CLIPModel`` with its ``CLIPProcessor``: the tiny tokenizer, images resized
    and centre-cropped to ``image_size``), randomly initialised from ``seed``, saved to ``folder`` with
    save_pretrained, as ``scalelong eval --clip`` loads it. Seed 7: the cosines of the tiny run's first
    4 evaluation samples with their captions have both signs, so a score that fails to clamp shows."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    folder.mkdir(parents=True)
    tokenizer, vocab = tiny_tokenizer(folder)
    torch.manual_seed(seed)
    text = dict(vocab_size=len(vocab), max_position_embeddings=77, bos_token_id=vocab["<|startoftext|>"],
                eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"])  # fmt: skip
    tiny = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    vision = dict(image_size=image_size, patch_size=8)
    cfg = CLIPConfig(text_config={**text, **tiny}, vision_config={**vision, **tiny}, projection_dim=16)
    CLIPModel(cfg).save_pretrained(folder)
    side = {"height": image_size, "width": image_size}
    images = CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size=side)
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(folder)
    return folder
