"""Command line: ``scalelong train | info | configs | sample | eval | fid-stats | compare | sweep | analyze |
extract-features``.

Every mistake a user can make (config, data, checkpoint, arguments) ends in one line on stderr
and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from scalelong.errors import ScaleLongError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        raise ScaleLongError(f"{self.prog}: {message} (see --help)")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config", help="YAML config file or preset name, e.g. demo (`scalelong configs` lists the presets)"
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="dotted overrides such as model.skip.method=cs model.skip.kappa=0.5",
    )


def cmd_train(args: argparse.Namespace) -> int:
    from scalelong.training.config import load_config

    cfg = load_config(args.config, args.overrides)
    if args.dry_run:
        return _print_info(cfg, dry_run=True)
    from scalelong.training.build import check_model
    from scalelong.training.launch import launch_processes
    from scalelong.training.runs import RunDir
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


def score_line(
    r: dict, where: str, digits: dict | None = None, real: dict | None = None, places: int = 4
) -> str:
    """One evaluation record (``fd``, ``fd_metric``, ``fd_samples``, ...) as one line, with the digit
    score beside FD-MNIST: what ``scalelong eval`` prints and ``scalelong train`` ends with."""
    how = f"{where}, {r['fd_samples']} samples, {r['fd_sampler']} {r['fd_steps']} steps"
    how += f", {r['fd_precision']}" if r.get("fd_precision") in ("bf16", "fp16") else ""
    line = f"{r['fd_metric']} {r['fd']:.{places}f} ({how})"
    if digits is not None:  # beside FD-MNIST, the readable part: recognisable digits and class balance
        from scalelong.metrics.fd_mnist import format_digit_score

        line += f"; digits: {format_digit_score(digits, real)}"
    return line


def evaluation_lines(run) -> list[str]:
    """What a finished run scored: its last evaluation (FD and, for FD-MNIST, the digit score), and
    the best step's re-score where ``eval.final_num_samples`` asked for one, or else how to score
    more samples; no lines for a run that never evaluated."""
    import json

    from scalelong.diagnostics import metric_names as names

    records = run.eval_records()
    if not records:
        return []
    step = max(records)
    r = records[step]

    def digit_score(record: dict) -> dict | None:  # beside FD-MNIST: whether the samples read as digits
        if not isinstance(record.get(names.DIGITS_CONFIDENT), (int, float)):
            return None
        return {
            "confident": record[names.DIGITS_CONFIDENT],
            "entropy": record.get(names.DIGITS_ENTROPY, float("nan")),
        }

    lines = [score_line(r, f"step {step}", digit_score(r), places=1)]
    try:
        final = json.loads(run.eval_final_file.read_text())
        line = (
            f"best step {final['best_step']} re-scored: {final['fd_metric']} {final['fd']:.1f} "
            f"({final['fd_samples']} samples)"
        )
        if (digits := digit_score(final)) is not None:
            from scalelong.metrics.fd_mnist import format_digit_score

            line += f"; digits: {format_digit_score(digits)}"
        lines.append(line)
    except FileNotFoundError:  # no re-score asked for (eval.final_num_samples: 0)
        if r["fd_samples"] < 1000:  # FD is biased upward on few samples
            lines.append(f"score it on more samples: scalelong eval {run.path} --n 1000")
    except (OSError, ValueError, KeyError, TypeError):
        pass  # an unreadable re-score file: the run's own log above still says what it scored
    return lines


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
    from scalelong.training.config import load_config

    return _print_info(load_config(args.config, args.overrides))


def _print_info(cfg, dry_run: bool = False) -> int:
    import yaml

    from scalelong.skips import KAPPA_METHODS, PAPER_METHODS, skip_table
    from scalelong.training.build import check_model, count_parameters
    from scalelong.training.config import config_to_dict

    model = check_model(cfg.model)  # shapes checked before anything is read; counted from it
    if dry_run:
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False).rstrip())
        print()
    print(f"model: {cfg.model.type}, {count_parameters(model):,} parameters")
    method = cfg.model.skip.method
    print(
        f"skips: {method}"
        + (f", kappa={cfg.model.skip.kappa:g}" if method in KAPPA_METHODS else "")
        + ("" if method in PAPER_METHODS else " (not one of the paper's methods; docs/method.md)")
    )
    print(skip_table(model))
    if dry_run:
        from scalelong.data import describe
        from scalelong.training.build import build_dataset, check_data_fits_model

        dataset = build_dataset(cfg.data)
        check_data_fits_model(cfg, dataset)
        print(f"data: {describe(dataset)}; images of shape {tuple(dataset[0][0].shape)}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
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
    from scalelong.training.evaluation import evaluate_run
    from scalelong.training.launch import resolve_device

    r = evaluate_run(
        args.run_dir, args.n, args.fid_stats, args.metric, args.sampler, args.steps, args.step,
        args.inception_weights, args.batch_size, resolve_device(args.device), not args.no_progress,
        weights=args.weights, mixed_precision=args.mixed_precision, captions=args.captions,
        guidance_scale=args.guidance_scale, text_encoder=args.text_encoder, autoencoder=args.autoencoder,
    )  # fmt: skip
    print(score_line(r, r["checkpoint"], r.get("digits"), r.get("digits_real")))
    return 0


def _step_arg(value: str) -> int | str:
    if value in ("latest", "best"):
        return value
    return _count(0)(value)


def _count(minimum: int):
    """An argparse type: an integer >= ``minimum`` (a bad value is argparse's one-line error)."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {number}")
        return number

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _add_sampling_commands(sub) -> None:
    """``sample``, ``fid-stats`` and ``eval``: drawing images from a run and scoring them."""
    from scalelong.metrics import METRIC_NAMES
    from scalelong.training.config import SAMPLER_NAMES

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
        p.add_argument("--no-progress", action="store_true", help="no progress bar")

    def checkpoint_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("run_dir", help="run directory written by `scalelong train`, e.g. runs/demo")
        p.add_argument("--sampler", choices=SAMPLER_NAMES, help="default: the run's config")
        p.add_argument("--steps", type=_count(1), help="sampler steps; default: the run's config")
        p.add_argument("--step", type=_step_arg, help="checkpoint step, 'latest' (default) or 'best'")
        p.add_argument("--batch-size", type=_count(1), help="images per network batch")
        p.add_argument(
            "--weights", default="ema", choices=("ema", "model"), help="EMA (default) or raw weights"
        )

    inception = "local pt_inception-2015-12-05 weights (offline machines); default: pytorch-fid's download"
    p = sub.add_parser("sample", help="draw images from a run's EMA weights", description=sample_doc)
    checkpoint_args(p)
    p.add_argument("--n", type=_count(1), required=True, help="number of images")
    p.add_argument("--out", required=True, help="folder for the PNGs and samples.npz")
    p.add_argument("--seed", type=int, default=0, help="image i is drawn from seed + i")
    p.add_argument(
        "--label", type=_count(0), help="class of every image (class-conditional runs); default: cycle"
    )
    p.add_argument("--prompt", action="append", help="text-to-image runs: a caption (repeatable)")
    p.add_argument("--prompts-file", help="text-to-image runs: captions, one per line")
    p.add_argument(
        "--guidance-scale", type=float, help="classifier-free guidance; default: the run's t2i config"
    )
    p.add_argument("--text-encoder", help="hub id or local folder; default: the run's t2i config")
    p.add_argument("--autoencoder", help="hub id or local folder; default: the run's t2i config")
    common(p)
    p.set_defaults(func=cmd_sample, batch_size=64)

    p = sub.add_parser(
        "fid-stats",
        help="reference feature statistics of a dataset",
        description="Compute the Inception (or FD-MNIST) feature mean and covariance of a config's dataset.",
    )
    _add_config_args(p)
    p.add_argument("--out", required=True, help="statistics file to write, e.g. stats/cifar10.npz")
    p.add_argument("--metric", default="fid", choices=METRIC_NAMES)
    p.add_argument("--inception-weights", help=inception)
    p.add_argument("--limit", type=_count(1), help="use only the first N images")
    p.add_argument("--images", help="a folder of images instead of the config's dataset, e.g. COCO/val2014")
    p.add_argument(
        "--center-crop",
        type=_count(1),
        help="--images: centre-crop to this side; default: the run's resolution (256 for MS-COCO)",
    )
    p.add_argument("--batch-size", type=_count(1), default=250)
    common(p)
    p.set_defaults(func=cmd_fid_stats)

    p = sub.add_parser(
        "eval",
        help="sample from a run and compute FID / FD-MNIST",
        description="Sample N images from a checkpoint's weights (EMA unless --weights model) and compute "
        "their Fréchet distance.",
    )
    checkpoint_args(p)
    p.add_argument(
        "--n", type=_count(2), default=10000, help="number of samples (the recipe: 10k, final 50k)"
    )
    p.add_argument("--fid-stats", help="reference statistics from `scalelong fid-stats` (read first)")
    p.add_argument("--metric", choices=METRIC_NAMES, help="default: the run's eval.metric")
    p.add_argument("--inception-weights", help=inception)
    p.add_argument(
        "--mixed-precision",
        choices=("no", "bf16", "fp16"),
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
    common(p)
    p.set_defaults(func=cmd_eval)


sample_doc = (
    "Draw N images from a run's latest checkpoint (EMA weights) as PNGs plus samples.npz. Image i uses "
    "seed + i, so results do not depend on the batch size; a second call draws only what is missing."
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="scalelong", description="ScaleLong: scaled long skip connections for diffusion training"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser(
        "train", help="train a model from a config", description="Train a diffusion model from a YAML config."
    )
    _add_config_args(p)
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
        type=_count(1),
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
    _add_config_args(p)
    p.set_defaults(func=cmd_info)
    _add_configs_command(sub)
    _add_sampling_commands(sub)
    _add_study_commands(sub)
    _add_t2i_commands(sub)
    return parser


def cmd_configs(args: argparse.Namespace) -> int:
    from scalelong.training.presets import PRESET_DIR, presets

    table = presets()
    width = max(map(len, table), default=0)
    for name, description in table.items():
        print(f"{name:<{width}}  {description}")
    print(f"\nPass a name wherever a config goes (scalelong train demo); the files: {PRESET_DIR}")
    return 0


def _add_configs_command(sub) -> None:
    p = sub.add_parser(
        "configs",
        help="list the shipped presets",
        description="List the YAML recipes shipped with scalelong, one line each. Every command that "
        "takes a config accepts a preset's name in place of a file; copy a file to make your own.",
    )
    p.set_defaults(func=cmd_configs)


def cmd_compare(args: argparse.Namespace) -> int:
    import textwrap

    from scalelong.studies.compare import comparison_configs, run_comparison
    from scalelong.studies.running import parse_methods
    from scalelong.training.config import load_config

    methods = parse_methods(args.methods)
    overrides = list(args.overrides) + ([f"train.steps={args.steps}"] if args.steps else [])
    cfg = load_config(args.config, overrides)
    # Beside, not inside, the single-run folder of the same name: train --overwrite must not delete it.
    report_dir = Path(cfg.out_dir) / f"{cfg.name}-compare" if args.out is None else Path(args.out)
    cluster = _cluster_options(args)
    cfgs = comparison_configs(cfg, methods, args.seeds, report_dir)
    if args.dry_run:
        return _print_plan(cfgs, report_dir, args, cluster)
    if args.report_only:
        from scalelong.studies.compare import report_comparison

        report, table = report_comparison(cfg, methods, args.seeds, report_dir)
        print(f"\n{table}\n")
        return _partial_report(cfgs, report)
    result = run_comparison(
        cfg, methods, args.seeds, report_dir, progress=not args.no_progress, jobs=args.jobs,
        gpus_per_run=args.gpus_per_run, cluster=cluster,
    )  # fmt: skip
    if not result.reported:
        return _report_paths(result, waited=cluster is None or cluster.wait)
    print(f"\n{result.table}\n")
    if result.legend:  # e.g. the digit score, with the real digits' values as the yardstick
        print(textwrap.fill(result.legend, 100) + "\n")
    if result.reading:  # the table in sentences, the seed-count warning first
        print(textwrap.fill(result.reading, 100) + "\n")
    return _report_paths(result)


def _cluster_options(args: argparse.Namespace):
    """The study's ``--executor`` and what goes with it: None for this machine's pool."""
    if args.executor == "pool":
        given = [f for f in ("partition", "time", "sbatch", "setup", "no_wait") if getattr(args, f)]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ScaleLongError(f"{flag} is for --executor slurm (or local), not this machine's pool")
        return None
    from scalelong.studies.cluster import ClusterOptions, parse_sbatch, parse_time

    return ClusterOptions(
        executor=args.executor,
        partition=args.partition,
        time_min=parse_time(args.time or "4:00:00"),
        sbatch=parse_sbatch(args.sbatch or []),
        setup=tuple(args.setup or ()),
        wait=not args.no_wait,
    )


def _print_plan(cfgs, folder: Path, args: argparse.Namespace | None = None, cluster=None) -> int:
    """``--dry-run`` of a study: check every run as the study would before its first, print the
    runs, where they would train, and the resolved config of the first (model, skips, data, as
    ``train --dry-run``); write nothing. GPUs this machine lacks are a warning, not an error: a
    dry run on a login node checks a study meant for a GPU machine."""
    from scalelong.studies.running import check_plan, placement_line, plan_table

    check_plan(cfgs)
    print(f"{len(cfgs)} runs in {folder / 'runs'}; report in {folder}")
    print(plan_table(cfgs))
    if args is not None:
        try:
            print("\n" + placement_line(cfgs, args.jobs, args.gpus_per_run, cluster))
        except ScaleLongError as e:  # checked on the machine the study starts on, maybe not this one
            print(f"\nwarning: {e} (on this machine the study would refuse to start)", file=sys.stderr)
        if cluster is not None:
            print(f"job folder: {cluster.job_folder(folder / 'runs')}")
    print(f"\nthe config of {cfgs[0].name} (the other runs differ only where the table says):\n")
    return _print_info(cfgs[0], dry_run=True)


def _partial_report(cfgs, report: Path) -> int:
    """``--report-only``: where the report of the finished runs is, and what the rest are doing."""
    from collections import Counter

    from scalelong.studies.running import plan_table

    actions = Counter(line.rsplit(None, 1)[-1] for line in plan_table(cfgs).splitlines()[1:])
    done = actions.pop("reuse", 0)
    print(f"report: {report}")
    print(f"        {report.with_suffix('.html')}")
    rest = ", ".join(f"{n} {a}" for a, n in sorted(actions.items()))
    print(f"{done} of {len(cfgs)} runs finished" + (f"; the others: {rest}" if rest else ""))
    return 0


def _report_paths(result, waited: bool = True) -> int:
    """Print where a study's report is; runs that failed, or that did not finish on a cluster,
    make it a user error (exit 2). Jobs submitted without waiting: how to read them later."""
    if not waited:
        counts = {s: sum(o.status == s for o in result.outcomes) for s in ("submitted", "running", "reused")}
        said = [f"{counts['submitted']} runs submitted"]
        if counts["running"]:
            said.append(f"{counts['running']} still in jobs of an earlier submission")
        if counts["reused"]:
            said.append(f"{counts['reused']} finished already")
        print(
            "; ".join(said) + ". The same command with --report-only writes the report of whatever has "
            "finished (at any time); the same command again submits what did not finish"
        )
        return 0
    if result.reported:
        print(f"report: {result.report}")
        print(f"        {result.report.with_suffix('.html')}")
    if result.failed:
        raise ScaleLongError(
            f"{len(result.failed)} of {len(result.outcomes)} runs failed (listed above and in the report); "
            "fix the cause and re-run the same command: finished runs are reused"
        )
    if result.unfinished:
        raise ScaleLongError(
            f"{len(result.unfinished)} of {len(result.outcomes)} runs did not finish (their jobs ended "
            "early or are still running, listed above); the report holds the finished ones; re-run the "
            "same command to resume the rest from their last checkpoints"
        )
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from scalelong.studies.running import parse_methods
    from scalelong.studies.sweep import check_fig1_lr, parse_numbers, plan, run_sweep
    from scalelong.training.config import load_config

    methods = parse_methods(args.methods)
    lrs = parse_numbers(args.lrs, "--lrs")
    check_fig1_lr(args.fig1_lr, lrs)
    depths = parse_numbers(args.depths, "--depths", int) if args.depths else None
    cfg = load_config(args.config, args.overrides)
    sweep_dir = Path(cfg.out_dir) / f"{args.name or cfg.name}-sweep"
    cluster = _cluster_options(args)
    cfgs = plan(cfg, methods, lrs, depths, args.seeds, sweep_dir / "runs")
    if args.dry_run:
        return _print_plan(cfgs, sweep_dir, args, cluster)
    if args.report_only:
        from scalelong.studies.sweep import report_sweep

        return _partial_report(cfgs, report_sweep(cfg, sweep_dir, fig1_lr=args.fig1_lr))
    result = run_sweep(
        cfg, methods, lrs, depths, args.seeds, sweep_dir, jobs=args.jobs, progress=not args.no_progress,
        fig1_lr=args.fig1_lr, gpus_per_run=args.gpus_per_run, cluster=cluster,
    )  # fmt: skip
    if result.reported:
        print(f"\n{result.table}\n")
    return _report_paths(result, waited=cluster is None or cluster.wait)


def cmd_analyze(args: argparse.Namespace) -> int:
    import math

    from scalelong.diagnostics import headroom_warning
    from scalelong.studies.plots import load_metrics, write_plots
    from scalelong.training.runs import RunDir, writer_of

    given = Path(args.run_dir)  # a run folder (of `scalelong train` or a RunLog), or its metrics.jsonl
    run = RunDir(given.parent if given.is_file() else given)
    warnings: list[str] = []
    records = load_metrics(given, warnings.append)
    log = given if given.is_file() else run.metrics_file
    if not records:
        empty = not log.read_text(errors="replace").strip()
        why = "is empty" if empty else "holds no record (a JSON object with an integer step)"
        raise ScaleLongError(f"nothing to plot: {log} {why}")
    if not any(k != "step" and math.isfinite(v) for r in records for k, v in r.items()):
        raise ScaleLongError(f"nothing to plot: the {len(records)} record(s) of {log} hold no finite number")
    for line in warnings:
        print(line)
    out = Path(args.out) if args.out else run.report_dir
    writer = writer_of(out)
    if writer is not None:  # a run in training: its folder is the trainer's
        raise ScaleLongError(f"{out} lies in {writer}, which another process writes; pass --out FOLDER")
    paths = write_plots({Path(os.path.abspath(run)).name or "run": records}, out)
    if not paths:
        raise ScaleLongError(
            f"nothing to plot: the {len(records)} record(s) of {log} hold no loss, feature_norm, "
            "block_grad_norm, fd, noise-level errors or changing skip coefficients"
        )
    for path in paths:
        print(path)
    headroom = headroom_warning(records)
    if headroom is not None:
        print(headroom)
    return 0


def _add_execution_args(p: argparse.ArgumentParser) -> None:
    """Where a study's runs train: this machine (``--jobs``, ``--gpus-per-run``) or a cluster."""
    p.add_argument(
        "--jobs",
        type=_count(1),
        default=None,
        help="runs trained at a time, in worker processes that divide the cores, each on its own "
        "GPU(s) where there are GPUs (default 1: one after another in this process); with "
        "--executor slurm, the most jobs running at once (default: no cap)",
    )
    p.add_argument(
        "--gpus-per-run",
        type=_count(1),
        default=1,
        help="GPUs of each run, one process per GPU through Accelerate (default 1)",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: write the report of the runs that have finished (while jobs still run)",
    )
    c = p.add_argument_group("a cluster (see the docs page 'Running a study on a cluster')")
    c.add_argument(
        "--executor",
        choices=("pool", "slurm", "local"),
        default="pool",
        help="pool (default): this machine; slurm: each run a SLURM job, through submitit "
        "(pip install 'scalelong[slurm]'); local: the same jobs as processes of this machine",
    )
    c.add_argument("--partition", default=None, help="sbatch --partition (default: the cluster's)")
    c.add_argument(
        "--time", default=None, help="each job's time limit, sbatch's --time (default 4:00:00; a run "
        "that needs longer is requeued and resumes)"
    )  # fmt: skip
    c.add_argument(
        "--sbatch",
        action="append",
        metavar="KEY=VALUE",
        help="another sbatch parameter, e.g. --sbatch account=proj --sbatch cpus-per-task=8 (repeatable)",
    )
    c.add_argument(
        "--setup", action="append", metavar="CMD", help="a shell line each job runs first, e.g. "
        "'module load cuda' (repeatable)"
    )  # fmt: skip
    c.add_argument(
        "--no-wait",
        action="store_true",
        help="submit and return; --report-only later writes the report of what has finished",
    )


def _add_study_commands(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="train several skip methods side by side and write one report",
        description="Train each method from the same seed, data order and noise, then write report.md, "
        "PNG plots and a self-contained report.html into <out_dir>/<name>-compare (or --out). Finished runs "
        "are reused, so re-running the same command resumes.",
    )
    _add_config_args(p)
    p.add_argument("--methods", default="none,sqrt2,cs,ls", help="comma-separated; the first is the baseline")
    p.add_argument(
        "--steps", type=_count(0), default=0, help="training steps per run (default: the config's)"
    )
    p.add_argument("--seeds", type=_count(1), default=1, help="seeds per method, from train.seed on")
    p.add_argument("--out", default=None, help="report folder (default: <out_dir>/<name>-compare)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check every run, print them and the resolved config of the first, then exit (nothing written)",
    )
    _add_execution_args(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "sweep",
        help="the stability map: methods x learning rates (x depths), several seeds",
        description="Train every (depth, lr, method) cell for K seeds and write, into "
        "<out_dir>/<name>-sweep, a heatmap per depth, the largest stable lr of each method and "
        "report.md / report.html. A run that diverges is recorded, not an abort. Finished runs are "
        "reused, and the report covers every finished run of this config in the folder, so a later "
        "call with more --seeds or other --lrs adds to the map.",
    )
    _add_config_args(p)
    p.add_argument("--methods", default="none,sqrt2,cs,ls", help="comma-separated skip methods")
    p.add_argument("--lrs", default="2e-3,5e-3,1e-2,2e-2", help="comma-separated learning rates (optim.lr)")
    p.add_argument("--depths", default=None, help="comma-separated U-ViT depths (model.uvit.depth)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per cell, from train.seed on")
    p.add_argument("--name", default=None, help="the sweep folder is <out_dir>/<name>-sweep (default: name)")
    p.add_argument(
        "--fig1-lr",
        type=float,
        default=None,
        help="the lr of the report's Fig. 1 (default: the smallest of --lrs)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check every run, print them and the resolved config of the first, then exit (nothing written)",
    )
    _add_execution_args(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser(
        "analyze",
        help="plots of one run",
        description="Draw the plots of one run (loss, norm of hidden features, gradient oscillation, skip "
        "coefficients, ...) from its metrics.jsonl: a folder `scalelong train` wrote, or one your own loop "
        "wrote with scalelong.RunLog (no config or checkpoint needed).",
    )
    p.add_argument(
        "run_dir", help="a folder holding metrics.jsonl (of `scalelong train` or a RunLog), or that file"
    )
    p.add_argument("--out", default=None, help="plot folder (default: RUN_DIR/report)")
    p.set_defaults(func=cmd_analyze)


def cmd_extract_features(args: argparse.Namespace) -> int:
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


def _add_t2i_commands(sub) -> None:
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
    p.add_argument("--resolution", type=_count(1), default=256)
    p.add_argument("--shard-size", type=_count(1), default=1024)
    p.add_argument("--batch-size", type=_count(1), default=16)
    p.add_argument("--device", default="auto")
    p.set_defaults(func=cmd_extract_features)


def one_line(message: str) -> str:
    """A message on one line, whatever a library folded into it."""
    return " ".join(part.strip() for part in message.strip().splitlines() if part.strip())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        # Overrides may stand before or after options; argparse alone keeps only the first run.
        args, extra = parser.parse_known_args(argv)
        unknown = [a for a in extra if a.startswith("-") or not hasattr(args, "overrides")]
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        if extra:
            args.overrides = [*args.overrides, *extra]
        return args.func(args)
    except ScaleLongError as e:
        if int(os.environ.get("RANK", "0")) == 0:  # one line per run, not one per process
            print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; the run directory holds the last complete checkpoint", file=sys.stderr)
        return 2


def _exit_as_worker(code: int) -> None:
    """A process of a multi-process run ends with exactly its exit code: the interpreter's teardown
    can abort (SIGABRT, "terminate called without an active exception") in the process group's
    destructors, also after a run that succeeded, and its launcher would then report a crash."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(argv: list[str] | None = None) -> None:
    """The ``scalelong`` command: :func:`main`, then exit with its code. A process of a multi-process
    run (started by the product's launcher, ``accelerate launch`` or ``torchrun``) skips the
    interpreter's teardown."""
    code = main(argv)
    # SCALELONG_LAUNCHER_PID: scalelong.training.launch.LAUNCHER_PID (not imported: it imports torch)
    if os.environ.get("SCALELONG_LAUNCHER_PID") or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _exit_as_worker(code)
    sys.exit(code)
