"""The commands that draw images from a run and score them: ``sample``, ``fid-stats`` and ``eval``.

Heavy modules (torch, the samplers, Inception) are imported inside the command bodies, so building
the parser stays light.
"""

from __future__ import annotations

import argparse

from scalelong.cli.arguments import add_config_args, at_least, checkpoint_step, seed
from scalelong.errors import ScaleLongError

SAMPLE_DOC = (
    "Draw N images from a run's latest checkpoint (EMA weights) as PNGs plus samples.npz. Image i uses "
    "seed + i, so results do not depend on the batch size; a second call draws only what is missing."
)

INCEPTION_WEIGHTS_HELP = (
    "local pt_inception-2015-12-05 weights (offline machines); default: pytorch-fid's download"
)


def cmd_sample(args: argparse.Namespace) -> int:
    """``scalelong sample``: a run's images as PNGs (by class, or by prompt for text-to-image)."""
    from scalelong.training.export import sample_prompts_to_dir, sample_to_dir
    from scalelong.training.launch import resolve_device

    if args.prompt or args.prompts_file:  # a text-to-image run: prompts, guidance, the autoencoder
        from scalelong.training.t2i import read_prompts

        r = sample_prompts_to_dir(
            args.run_dir, args.out, read_prompts(args.prompt, args.prompts_file), args.n,
            sampler=args.sampler, steps=args.steps, seed=args.seed, batch_size=args.batch_size,
            guidance_scale=args.guidance_scale, step=args.step, weights=args.weights,
            text_encoder=args.text_encoder, autoencoder=args.autoencoder,
            device=resolve_device(args.device), progress=not args.no_progress,
        )  # fmt: skip
        print(f"{r['total']} images ({r['drawn']} new) from {r['checkpoint']} in {r['out']}")
        return 0
    r = sample_to_dir(
        args.run_dir, args.out, args.n, args.sampler, args.steps, args.seed, args.batch_size, args.label,
        args.step, args.weights, resolve_device(args.device), not args.no_progress,
    )  # fmt: skip
    print(f"{r['total']} images ({r['drawn']} new) from {r['checkpoint']} in {r['out']}")
    return 0


def cmd_fid_stats(args: argparse.Namespace) -> int:
    """``scalelong fid-stats``: the reference feature statistics of a config's dataset or a folder."""
    from scalelong.training.config import load_config
    from scalelong.training.evaluation import compute_reference_stats
    from scalelong.training.launch import resolve_device

    cfg = load_config(args.config, args.overrides)
    if args.center_crop and not args.images:
        raise ScaleLongError("--center-crop crops the images of --images DIR; pass the folder too")
    path, count = compute_reference_stats(
        cfg,
        args.out,
        args.metric,
        args.inception_weights,
        args.limit,
        args.batch_size,
        resolve_device(args.device),
        images=args.images,
        center_crop=args.center_crop,
    )
    what = f"images of {args.images}" if args.images else f"{cfg.data.name} images"
    print(f"{args.metric} statistics of {count} {what}: {path}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """``scalelong eval``: sample from a checkpoint and print its Fréchet distance in one line."""
    from scalelong.training.evaluation import evaluate_run
    from scalelong.training.launch import resolve_device
    from scalelong.training.runs import score_line

    r = evaluate_run(
        args.run_dir, args.n, args.fid_stats, args.metric, args.sampler, args.steps, args.step,
        args.inception_weights, args.batch_size, resolve_device(args.device), not args.no_progress,
        weights=args.weights, mixed_precision=args.mixed_precision, captions=args.captions,
        guidance_scale=args.guidance_scale, text_encoder=args.text_encoder, autoencoder=args.autoencoder,
        clip=args.clip,
    )  # fmt: skip
    print(score_line(r, r["checkpoint"], r.get("digits"), r.get("digits_real")))
    return 0


def _add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    """Which run, checkpoint and weights to draw from, and how."""
    from scalelong.training.config import SAMPLER_NAMES

    p.add_argument("run_dir", help="run directory written by `scalelong train`, e.g. runs/demo")
    p.add_argument("--sampler", choices=SAMPLER_NAMES, help="default: the run's config")
    p.add_argument("--steps", type=at_least(1), help="sampler steps; default: the run's config")
    p.add_argument("--step", type=checkpoint_step, help="checkpoint step, 'latest' (default) or 'best'")
    p.add_argument("--batch-size", type=at_least(1), help="images per network batch")
    p.add_argument("--weights", default="ema", choices=("ema", "model"), help="EMA (default) or raw weights")


def add_commands(sub) -> None:
    """Add ``sample``, ``fid-stats`` and ``eval`` to the ``scalelong`` subparsers ``sub``."""
    from scalelong.metrics import METRIC_NAMES
    from scalelong.training.config import MIXED_PRECISION

    p = sub.add_parser("sample", help="draw images from a run's EMA weights", description=SAMPLE_DOC)
    _add_checkpoint_args(p)
    p.add_argument("--n", type=at_least(1), required=True, help="number of images")
    p.add_argument("--out", required=True, help="folder for the PNGs and samples.npz")
    p.add_argument("--seed", type=seed, default=0, help="image i is drawn from seed + i")
    p.add_argument(
        "--label", type=at_least(0), help="class of every image (class-conditional runs); default: cycle"
    )
    p.add_argument("--prompt", action="append", help="text-to-image runs: a caption (repeatable)")
    p.add_argument("--prompts-file", help="text-to-image runs: captions, one per line")
    p.add_argument(
        "--guidance-scale", type=float, help="classifier-free guidance; default: the run's t2i config"
    )
    p.add_argument("--text-encoder", help="hub id or local folder; default: the run's t2i config")
    p.add_argument("--autoencoder", help="hub id or local folder; default: the run's t2i config")
    _add_device_args(p)
    p.set_defaults(func=cmd_sample, batch_size=64)

    p = sub.add_parser(
        "fid-stats",
        help="reference feature statistics of a dataset",
        description="Compute the Inception (or FD-MNIST) feature mean and covariance of a config's dataset.",
    )
    add_config_args(p)
    p.add_argument("--out", required=True, help="statistics file to write, e.g. stats/cifar10.npz")
    p.add_argument("--metric", default="fid", choices=METRIC_NAMES)
    p.add_argument("--inception-weights", help=INCEPTION_WEIGHTS_HELP)
    p.add_argument("--limit", type=at_least(1), help="use only the first N images")
    p.add_argument("--images", help="a folder of images instead of the config's dataset, e.g. COCO/val2014")
    p.add_argument(
        "--center-crop",
        type=at_least(1),
        help="--images: centre-crop to this side; default: the run's resolution (256 for MS-COCO)",
    )
    p.add_argument("--batch-size", type=at_least(1), default=250)
    _add_device_args(p)
    p.set_defaults(func=cmd_fid_stats)

    p = sub.add_parser(
        "eval",
        help="sample from a run and compute FID / FD-MNIST",
        description="Sample N images from a checkpoint's weights (EMA unless --weights model) and compute "
        "their Fréchet distance.",
    )
    _add_checkpoint_args(p)
    p.add_argument(
        "--n", type=at_least(2), default=10000, help="number of samples (the recipe: 10k, final 50k)"
    )
    p.add_argument(
        "--fid-stats",
        help="reference statistics from `scalelong fid-stats` (read first; default: the run's "
        "eval.fid_stats)",
    )
    p.add_argument("--metric", choices=METRIC_NAMES, help="default: the run's eval.metric")
    p.add_argument("--inception-weights", help=INCEPTION_WEIGHTS_HELP)
    p.add_argument(
        "--mixed-precision",
        choices=MIXED_PRECISION,
        help="the sampler's forward; default: the run's eval.mixed_precision",
    )
    p.add_argument(
        "--captions",
        help="text-to-image runs: MS-COCO captions JSON (captions_val2014.json), one drawn per sample",
    )
    p.add_argument(
        "--guidance-scale", type=float, help="text-to-image runs: default the run's t2i.guidance_scale"
    )
    p.add_argument("--text-encoder", help="text-to-image runs: hub id or local folder; default: the run's")
    p.add_argument("--autoencoder", help="text-to-image runs: hub id or local folder; default: the run's")
    p.add_argument(
        "--clip",
        metavar="PATH",
        help="text-to-image runs: also the mean CLIP score of the samples with their captions, by the CLIP "
        "model saved in this local folder (CLIPModel and CLIPProcessor, save_pretrained)",
    )
    _add_device_args(p)
    p.set_defaults(func=cmd_eval)
