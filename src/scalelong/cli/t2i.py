"""The text-to-image command: ``extract-features``, an MS-COCO-style folder as latent and caption
shards. The encoders (torch, transformers, diffusers) are imported inside the command body."""

from __future__ import annotations

import argparse
from pathlib import Path

from scalelong.cli.arguments import at_least


def cmd_extract_features(args: argparse.Namespace) -> int:
    """``scalelong extract-features``: encode images and captions into shards, then count them."""
    from scalelong.training.launch import resolve_device
    from scalelong.training.t2i import extract_features, load_autoencoder, load_text_encoder

    device = resolve_device(args.device)
    tokenizer, text_encoder = load_text_encoder(args.text_encoder)
    autoencoder = load_autoencoder(args.autoencoder)
    meta = extract_features(
        Path(args.images),
        Path(args.captions),
        Path(args.out),
        autoencoder,
        tokenizer,
        text_encoder,
        resolution=args.resolution,
        shard_size=args.shard_size,
        batch_size=args.batch_size,
        device=device,
    )
    print(f"{meta['images']:,} images, {meta['captions']:,} captions in {meta['shards']} shards: {args.out}")
    return 0


def add_commands(sub) -> None:
    """Add ``extract-features`` to the ``scalelong`` subparsers ``sub``."""
    from scalelong.training.config import T2IConfig

    p = sub.add_parser(
        "extract-features",
        help="encode an MS-COCO-style folder into latent + caption shards",
        description="Centre-crop images, encode them with the Stable Diffusion autoencoder and their "
        "captions with CLIP, into safetensors shards for data.name=coco_latents. Resumable.",
    )
    p.add_argument("images", help="image folder, e.g. COCO/train2014")
    p.add_argument("captions", help="MS-COCO captions JSON, e.g. annotations/captions_train2014.json")
    p.add_argument("--out", required=True, help="feature folder to write")
    p.add_argument("--autoencoder", default=T2IConfig.autoencoder, help="hub id or local folder")
    p.add_argument("--text-encoder", default=T2IConfig.text_encoder, help="hub id or local folder")
    p.add_argument("--resolution", type=at_least(1), default=256)
    p.add_argument("--shard-size", type=at_least(1), default=1024)
    p.add_argument("--batch-size", type=at_least(1), default=16)
    p.add_argument("--device", default="auto")
    p.set_defaults(func=cmd_extract_features)
