"""The study commands: ``compare``, ``sweep`` (with where their runs train: this machine's pool or a
cluster, ``--dry-run`` and ``--report-only``) and ``analyze``, the plots of one run.

The studies themselves live in :mod:`scalelong.studies`; this module parses their options and
prints where the report is. Heavy modules are imported inside the command bodies.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from scalelong.cli.arguments import add_config_args, at_least
from scalelong.cli.training import print_info
from scalelong.errors import ScaleLongError


def cmd_compare(args: argparse.Namespace) -> int:
    """``scalelong compare``: train skip methods side by side, print the table and the report's paths."""
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
        except ScaleLongError as e:  # the pool's GPUs are checked on the machine the study starts on
            if cluster is not None:  # a cluster plan holds no GPU of this machine: its error is the study's
                raise
            print(f"\nwarning: {e} (on this machine the study would refuse to start)", file=sys.stderr)
        if cluster is not None:
            print(f"job folder: {cluster.job_folder(folder / 'runs')}")
    print(f"\nthe config of {cfgs[0].name} (the other runs differ only where the table says):\n")
    return print_info(cfgs[0], dry_run=True)


def _partial_report(cfgs, report: Path) -> int:
    """``--report-only``: where the report of the finished runs is, and what the rest are doing."""
    from collections import Counter

    from scalelong.studies.running import plan_table

    actions = Counter(line.rsplit(None, 1)[-1] for line in plan_table(cfgs).splitlines()[1:])
    done = actions.pop("reuse", 0)
    print(f"report: {report}")
    print(f"        {report.with_suffix('.html')}")
    if not done and not (report.parent / "runs").is_dir():  # a study's folder kept without its runs
        print(f"made from {report.parent / 'map.json'}: none of the {len(cfgs)} runs' folders is here")
        return 0
    rest = ", ".join(f"{n} {a}" for a, n in sorted(actions.items()))
    print(f"{done} of {len(cfgs)} runs finished" + (f"; the others: {rest}" if rest else ""))
    return 0


def _report_paths(result, waited: bool = True) -> int:
    """Print where a study's report is; runs that failed, or that did not finish on a cluster,
    make it a user error (exit 2), runs another process trains do not (one line says how to
    report them later). Jobs submitted without waiting: how to read them later."""
    statuses = ("submitted", "running", "training", "reused")
    if not waited:
        counts = {s: sum(o.status == s for o in result.outcomes) for s in statuses}
        said = [f"{counts['submitted']} run{'' if counts['submitted'] == 1 else 's'} submitted"]
        if counts["running"]:
            said.append(f"{counts['running']} still in jobs of an earlier submission")
        if counts["training"]:
            said.append(f"{counts['training']} being trained by another process")
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
    if result.elsewhere:  # a second study in the same folder: the first one's runs are no failure
        later = "the report leaves them out" if result.reported else "no report is written"
        print(
            f"{len(result.elsewhere)} of {len(result.outcomes)} runs are being trained by another process "
            f"(listed above), not by this one; {later} until it ends: then the same command with "
            "--report-only (or the same command again) takes them in"
        )
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
    """``scalelong sweep``: train the stability map's runs, print its table and the report's paths."""
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

        return _partial_report(cfgs, report_sweep(cfg, sweep_dir, fig1_lr=args.fig1_lr, beside=args.beside))
    result = run_sweep(
        cfg, methods, lrs, depths, args.seeds, sweep_dir, jobs=args.jobs, progress=not args.no_progress,
        fig1_lr=args.fig1_lr, gpus_per_run=args.gpus_per_run, cluster=cluster, beside=args.beside,
    )  # fmt: skip
    if result.reported:
        print(f"\n{result.table}\n")
    return _report_paths(result, waited=cluster is None or cluster.wait)


def cmd_analyze(args: argparse.Namespace) -> int:
    """``scalelong analyze``: the plots of one run's metrics log, one path a line."""
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


def _add_study_run_args(p: argparse.ArgumentParser) -> None:
    """What ``compare`` and ``sweep`` share after their own options: ``--dry-run``, where and how
    their runs train, and the progress lines."""
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check every run, print them and the resolved config of the first, then exit (nothing written)",
    )
    _add_execution_args(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_execution_args(p: argparse.ArgumentParser) -> None:
    """Where a study's runs train: this machine (``--jobs``, ``--gpus-per-run``) or a cluster."""
    p.add_argument(
        "--jobs",
        type=at_least(1),
        default=None,
        help="runs trained at a time, in worker processes that divide the cores, each on its own "
        "GPU(s) where there are GPUs (default 1: one after another in this process); with "
        "--executor slurm, the most jobs running at once (default: no cap); with --executor local, "
        "the jobs run at a time while the command waits (not with --no-wait; default: all at once)",
    )
    p.add_argument(
        "--gpus-per-run",
        type=at_least(1),
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


def add_commands(sub) -> None:
    """Add ``compare``, ``sweep`` and ``analyze`` to the ``scalelong`` subparsers ``sub``."""
    p = sub.add_parser(
        "compare",
        help="train several skip methods side by side and write one report",
        description="Train each method from the same seed, data order and noise, then write report.md, "
        "PNG plots and a self-contained report.html into <out_dir>/<name>-compare (or --out). Finished runs "
        "are reused, so re-running the same command resumes.",
    )
    add_config_args(p)
    p.add_argument("--methods", default="none,sqrt2,cs,ls", help="comma-separated; the first is the baseline")
    p.add_argument(
        "--steps", type=at_least(0), default=0, help="training steps per run (default: the config's)"
    )
    p.add_argument("--seeds", type=at_least(1), default=1, help="seeds per method, from train.seed on")
    p.add_argument("--out", default=None, help="report folder (default: <out_dir>/<name>-compare)")
    _add_study_run_args(p)
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
    add_config_args(p)
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
        "--beside",
        default=None,
        metavar="PATH",
        help="another sweep's folder or map.json, the same grid in another precision: the report sets "
        "the two side by side (basin, failures by cause, fp16 headroom against fp16 overflows); "
        "map.json records it, so --report-only finds it again",
    )
    _add_study_run_args(p)
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
