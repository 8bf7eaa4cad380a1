"""The commands of one training run: ``train`` (and ``train --dry-run``), ``info`` and ``configs``.

Heavy modules (torch, the trainer) are imported inside the command bodies: ``scalelong --help``
and ``scalelong configs`` answer without them.
"""

from __future__ import annotations

import argparse
import os

from scalelong.cli.arguments import add_config_args, at_least


def cmd_train(args: argparse.Namespace) -> int:
    """``scalelong train``: train a run (on several processes where asked), then say where it is."""
    from scalelong.training.config import load_config

    cfg = load_config(args.config, args.overrides)
    if args.dry_run:
        return print_info(cfg, dry_run=True)
    from scalelong.training.build import check_model
    from scalelong.training.launch import launch_processes
    from scalelong.training.runs import RunDir, evaluation_lines
    from scalelong.training.train import train

    check_model(cfg.model)  # a shape the model rejects: one line now, before the data is read
    processes = args.num_processes or cpu_processes(cfg)
    if processes > 1:
        flags = [f for f in ("overwrite", "resume", "no_progress") if getattr(args, f)]
        argv = [args.config, *args.overrides, *(f"--{f.replace('_', '-')}" for f in flags)]
        return launch_processes(processes, ["train", *argv, "--num-processes", "1"], run_dir=cfg.run_dir)
    result = train(cfg, overwrite=args.overwrite, progress=not args.no_progress, resume=args.resume or None)
    if int(os.environ.get("RANK", "0")) != 0:  # the main process reports for the run
        return 0
    print(f"final loss {result.final_loss:.4f}")
    run = RunDir(result.run_dir)
    for line in evaluation_lines(run):
        print(line)
    print(f"metrics:    {run.metrics_file}")
    print(f"checkpoint: {result.checkpoint}")
    if result.samples is not None:
        print(f"samples:    {result.samples}")
    return 0


def cpu_processes(cfg) -> int:
    """The processes ``train.cpu_processes`` asks for: on a CPU-only run not already launched as
    processes, at most one per core; else 1."""
    from scalelong.training.launch import cpu_cores, resolve_device

    if cfg.train.cpu_processes <= 1 or "WORLD_SIZE" in os.environ:
        return 1
    if resolve_device(cfg.train.device, "train.device=").type != "cpu":
        return 1
    return min(cfg.train.cpu_processes, cpu_cores())


def cmd_info(args: argparse.Namespace) -> int:
    """``scalelong info``: the model summary and skip table of a config."""
    from scalelong.training.config import load_config

    return print_info(load_config(args.config, args.overrides))


def print_info(cfg, dry_run: bool = False) -> int:
    """Print a config's model summary; with ``dry_run`` also the resolved config before it and the
    data after it, as ``train --dry-run`` and a study's ``--dry-run`` show them."""
    import yaml

    from scalelong.training.build import check_model, model_summary
    from scalelong.training.config import config_to_dict

    model = check_model(cfg.model)  # shapes checked before anything is read; counted from it
    if dry_run:
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False).rstrip())
        print()
    print(model_summary(cfg.model, model))
    if dry_run:
        from scalelong.data import describe
        from scalelong.training.build import build_dataset, check_data_fits_model

        dataset = build_dataset(cfg.data)
        check_data_fits_model(cfg, dataset)
        print(f"data: {describe(dataset)}; images of shape {tuple(dataset[0][0].shape)}")
    return 0


def cmd_configs(args: argparse.Namespace) -> int:
    """``scalelong configs``: the shipped presets, one line each."""
    from scalelong.training.presets import PRESET_DIR, presets

    table = presets()
    width = max(map(len, table), default=0)
    for name, description in table.items():
        print(f"{name:<{width}}  {description}")
    print(f"\nPass a name wherever a config goes (scalelong train demo); the files: {PRESET_DIR}")
    return 0


def add_commands(sub) -> None:
    """Add ``train``, ``info`` and ``configs`` to the ``scalelong`` subparsers ``sub``."""
    p = sub.add_parser(
        "train", help="train a model from a config", description="Train a diffusion model from a YAML config."
    )
    add_config_args(p)
    p.add_argument(
        "--dry-run", action="store_true", help="print the resolved config, model and data, then exit"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing run directory of the same name"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="require a checkpoint to continue from (an existing run of the same config resumes anyway)",
    )
    p.add_argument(
        "--num-processes",
        type=at_least(1),
        default=0,
        help="train on N processes of this machine (GPUs, or CPU with gloo); default: 1, or on a CPU "
        "train.cpu_processes",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "info",
        help="model summary and skip table",
        description="Print the parameter count and the skip table: index, shape, coefficient.",
    )
    add_config_args(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser(
        "configs",
        help="list the shipped presets",
        description="List the YAML recipes shipped with scalelong, one line each. Every command that "
        "takes a config accepts a preset's name in place of a file; copy a file to make your own.",
    )
    p.set_defaults(func=cmd_configs)
