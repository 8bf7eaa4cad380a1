"""``scalelong compare``: train several skip methods side by side at one config and write one report.

Every method of a seed starts from the same trunk weights (the skip module is built after the
backbone's initialisation), sees the same batches in the same order and the same noise, so the
methods differ only in how the skips are scaled. Claims rest on several seeds: the table gives
means with 95% t-intervals over seeds, and the change in final FD and the speed-up against the
baseline are paired by seed (:func:`scalelong.studies.statistics.contrast`).

What is specific to a comparison lives here: its runs (one per method and seed), the steps each
method needs to reach the baseline's final FD, the table and the report. Running, the divergence
rule, the statistics, the per-seed summaries, the reading and the report's pieces are the
:mod:`scalelong.studies` package's.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from scalelong.diagnostics import metric_names as names
from scalelong.errors import ScaleLongError
from scalelong.metrics.fd_mnist import real_digit_score
from scalelong.studies.divergence import DEFAULT_RULE, criteria
from scalelong.studies.plots import Records, plot_digit_score, series, write_plots
from scalelong.studies.reading import reading
from scalelong.studies.report import (
    DIGIT_HEADER,
    FIGURE_CAPTIONS,
    digit_headers,
    digit_legend,
    has_digits,
    plot_caption,
    sample_grid_section,
    write_markdown_report,
)
from scalelong.studies.running import StudyResult, concluded, run_all
from scalelong.studies.statistics import fmt_ci, fmt_contrast
from scalelong.studies.summary import (
    MethodSummary,
    StudyRun,
    average_records,
    broken_runs,
    read_run,
    summarise_run,
)
from scalelong.training.config import Config
from scalelong.training.runs import RunDir

if TYPE_CHECKING:
    from scalelong.studies.cluster import ClusterOptions


@dataclass
class TargetResult:
    """Steps each method needs to reach the baseline's final value of a lower-is-better metric."""

    target: float  # the baseline's last finite value
    steps: dict[str, int | None]  # first logged step at or below target; None if never reached
    speedup: dict[str, float | None]  # baseline's steps / method's steps


def steps_to_target(
    records_by_method: Mapping[str, Records], baseline: str, key: str = names.FD
) -> TargetResult:
    """Steps to reach the baseline's final ``key`` (e.g. Frechet distance) and the speed-up.

    The baseline's own count is the first step at which it reached its final value (which can
    be earlier than its last step when the metric is not monotone), so the baseline's speed-up is 1.
    """
    if baseline not in records_by_method:
        raise ScaleLongError(f"baseline {baseline!r} not among the methods {sorted(records_by_method)}")
    _, base_values = series(records_by_method[baseline], key)
    finite = [v for v in base_values if math.isfinite(v)]
    if not finite:
        raise ScaleLongError(f"the baseline {baseline!r} has no finite {key!r} values")
    target = finite[-1]
    steps: dict[str, int | None] = {}
    for method, records in records_by_method.items():
        # NaN compares False, so a diverged evaluation never counts as reaching the target.
        steps[method] = next((s for s, v in zip(*series(records, key), strict=True) if v <= target), None)
    base_steps = steps[baseline]
    speedup = {m: (base_steps / s if s and base_steps else None) for m, s in steps.items()}
    return TargetResult(target, steps, speedup)


def _targets(records_by_method: Mapping[str, Records], baseline: str, key: str) -> TargetResult:
    try:
        return steps_to_target(records_by_method, baseline, key)
    except ScaleLongError:  # no finite baseline value (no evaluation, or it diverged): no target
        return TargetResult(math.nan, dict.fromkeys(records_by_method), dict.fromkeys(records_by_method))


def summarise(studies: Mapping[str, Sequence[StudyRun]], baseline: str) -> list[MethodSummary]:
    """Per-method summaries of ``studies[method]`` (its runs, one per seed): each run's
    :class:`~scalelong.studies.summary.SeedSummary`, and the step at which it reached the final
    FD of the baseline's run of the same seed (:func:`steps_to_target`; None without that run)."""
    if baseline not in studies:
        raise ScaleLongError(f"baseline {baseline!r} not among the methods {sorted(studies)}")
    base = {r.seed: r.records for r in studies[baseline] if r.seed is not None}

    def reached(run: StudyRun) -> int | None:
        if run.seed not in base:
            return None
        return _targets({"run": run.records, "baseline": base[run.seed]}, "baseline", names.FD).steps["run"]

    return [
        MethodSummary(method, [summarise_run(r) for r in runs], [reached(r) for r in runs])
        for method, runs in studies.items()
    ]


def summary_table(
    summaries: Sequence[MethodSummary], baseline: str, real_digits: Mapping | None = None
) -> str:
    """Markdown table of the comparison: means ± 95% t-intervals over seeds, and the change in
    final FD and the speed-up against ``baseline`` with their 95% intervals, paired by seed
    (``unpaired`` where no seed is shared). The digit-score columns appear when the runs logged
    them (eval.metric fd-mnist); ``real_digits`` is their yardstick (default
    :func:`scalelong.metrics.fd_mnist.real_digit_score`)."""
    base = next(s for s in summaries if s.method == baseline)
    digits = has_digits(*(s.values(k) for s in summaries for k in ("confident", "entropy")))
    extra = digit_headers(real_digits) if digits else []
    head = ["method", "final FD", f"final FD vs {baseline} (95% CI)", *extra, "final loss"]
    head += ["feature-norm osc. std", "loss spikes", f"steps to {baseline}'s final FD"]
    head += [f"speed-up vs {baseline} (95% CI)", "diverged"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for s in summaries:
        n, reached = s.count, [x for x in s.steps_to_target if x is not None]
        steps = (
            f"{statistics.median(reached):.0f} ({len(reached)}/{n} seeds)"
            if reached
            else f"not reached (0/{n})"
        )
        change = "(baseline)" if s is base else fmt_contrast(s.fd_change(base), as_percent=True)
        speedup = "(baseline)" if s is base else fmt_contrast(s.speedup(base), unit="x")
        scores = [fmt_ci(s.values("confident"), 2), fmt_ci(s.values("entropy"), 2)] if digits else []
        row = [s.method, fmt_ci(s.values("final_fd")), change, *scores, fmt_ci(s.values("final_loss"))]
        row += [
            fmt_ci(s.values("feature_osc")),
            fmt_ci(s.values("spikes")),
            steps,
            speedup,
            criteria(s.breaks),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def method_config(base: Config, method: str, seed: int, out_dir: Path) -> Config:
    """The config of one run of a comparison: ``method`` at ``seed``, named ``<method>-seed<k>``."""
    cfg = copy.deepcopy(base)
    cfg.model.skip.method = method
    cfg.train.seed = seed
    cfg.out_dir = str(out_dir)
    cfg.name = f"{method}-seed{seed}"
    return cfg


def comparison_configs(base: Config, methods: Sequence[str], seeds: int, report_dir: Path) -> list[Config]:
    """Every run of a comparison, seed by seed, under ``report_dir/runs``: seed ``train.seed + k``."""
    return [
        method_config(base, m, base.train.seed + k, report_dir / "runs")
        for k in range(seeds)
        for m in methods
    ]


def run_comparison(
    base: Config,
    methods: Sequence[str],
    seeds: int,
    report_dir: Path,
    progress: bool = True,
    jobs: int | None = 1,
    train_kwargs: Mapping | None = None,
    gpus_per_run: int = 1,
    cluster: ClusterOptions | None = None,
) -> StudyResult:
    """Train every method for every seed (reusing finished runs; ``jobs`` at a time,
    ``gpus_per_run`` GPUs each where there are GPUs, or as a cluster's jobs:
    :func:`scalelong.studies.running.run_all`) and write the report. Runs that diverge or fail
    are recorded in it; the others are trained all the same. A run whose job ended before it
    did is left out of the report, as is every run when the jobs were submitted without waiting
    (``cluster.wait`` False: :func:`report_comparison` writes the report later)."""
    cfgs = comparison_configs(base, methods, seeds, report_dir)
    outcomes = run_all(cfgs, jobs, progress, train_kwargs, gpus_per_run=gpus_per_run, cluster=cluster)
    if cluster is not None and not cluster.wait:  # the jobs have only just been submitted
        return StudyResult(report_dir / "report.md", "", outcomes, reported=False)
    if any(o.unfinished for o in outcomes):  # what has finished, as --report-only reads it
        try:
            report, table = report_comparison(base, methods, seeds, report_dir)
        except ScaleLongError:  # the baseline has no finished run yet
            return StudyResult(report_dir / "report.md", "", outcomes, reported=False)
        return StudyResult(report, table, outcomes)
    studies: dict[str, list[StudyRun]] = {m: [] for m in methods}
    for cfg, outcome in zip(cfgs, outcomes, strict=True):
        error = outcome.message if outcome.status == "failed" else ""
        studies[cfg.model.skip.method].append(read_run(cfg.run_dir, error=error))
    report, table = write_report(studies, methods[0], report_dir, base)
    legend = digit_legend(markdown=False) if DIGIT_HEADER in table else ""
    text = reading(summarise(studies, methods[0]), methods[0], base.eval.every, base.train.steps, seeds)
    return StudyResult(report, table, outcomes, legend, text)


def report_comparison(base: Config, methods: Sequence[str], seeds: int, report_dir: Path) -> tuple[Path, str]:
    """Write the report of the comparison's runs that have concluded, without training: while a
    cluster's jobs are still running, or after a study cut short. Methods with no concluded run
    are left out; the baseline (``methods[0]``) needs one. Returns report.md's path and the table."""
    studies: dict[str, list[StudyRun]] = {}
    for cfg in comparison_configs(base, methods, seeds, report_dir):
        if concluded(RunDir(cfg.run_dir)):
            studies.setdefault(cfg.model.skip.method, []).append(read_run(cfg.run_dir))
    if methods[0] not in studies:
        raise ScaleLongError(
            f"no run of the baseline {methods[0]!r} has finished in {report_dir / 'runs'}: "
            "nothing to report yet"
        )
    ordered = {m: studies[m] for m in methods if m in studies}
    return write_report(ordered, methods[0], report_dir, base)


def write_report(
    studies: Mapping[str, Sequence[StudyRun]], baseline: str, report_dir: Path, base: Config
) -> tuple[Path, str]:
    """report.md, PNG plots (means over seeds), the sample grids and a self-contained report.html in
    ``report_dir``; returns the path of report.md and the summary table (markdown).

    The report reads top down: the summary table and its reading in plain sentences
    (:func:`scalelong.studies.reading.reading`), the final samples of every method side by side,
    Fig. 1 (hidden-feature norm), the error per noise level, then the runs that broke, the
    training curves and the learned skip coefficients.
    """
    report_dir.mkdir(parents=True, exist_ok=True)
    runs = {m: [r.records for r in rs] for m, rs in studies.items()}
    summaries = summarise(studies, baseline)
    table = summary_table(summaries, baseline)
    averaged = {m: average_records([r for r in rr if r]) for m, rr in runs.items()}
    plots = write_plots(averaged, report_dir)
    if has_digits(*(s.values("confident") for s in summaries)):
        plots.append(plot_digit_score(averaged, report_dir / "digits.png", real_digit_score()))
    by_name = {p.stem: p for p in plots}
    seeds = len(next(iter(runs.values())))
    depth = getattr(base.model, base.model.type, None)
    header = (
        f"{base.model.type} ({'depth ' + str(depth.depth) if hasattr(depth, 'depth') else ''}), "
        f"data {base.data.name}, {base.train.steps} steps, batch {base.train.batch_size}, "
        f"{seeds} seed(s) from {base.train.seed}. Values are means over seeds ± the half-width of a "
        f"95% t-interval. The change in final FD and the speed-up against {baseline} are geometric "
        "means of the per-seed ratios over the seeds both ran, with 95% intervals (marked unpaired, "
        "Welch's, where they share no seed). FD is the Frechet distance "
        f"({base.eval.metric}) of EMA samples."
    )
    parts = [f"# ScaleLong comparison: {', '.join(runs)}", header, table]
    # Right under the table, so it is read first; it carries the seed-count warning too.
    parts.append(reading(summaries, baseline, base.eval.every, base.train.steps, seeds))
    if DIGIT_HEADER in table:
        parts.append(digit_legend())
    parts += sample_grid_section(studies, report_dir, base)
    for name, heading in (("feature_norm", "Fig. 1: hidden-feature norm"), ("noise_levels", "Noise levels")):
        if name in by_name:
            parts += [f"## {heading}", FIGURE_CAPTIONS[name], f"![{heading}]({by_name.pop(name).name})"]
    broken = broken_runs(r for rs in studies.values() for r in rs)
    if broken:
        parts += ["## Runs that diverged or failed", DEFAULT_RULE.describe(), "\n".join(broken)]
    order = ("fd", "digits", "loss", "grad_oscillation")  # the samples' scores first
    curves = sorted(
        (p for p in by_name.values() if not p.stem.startswith("coefficients_")),
        key=lambda p: order.index(p.stem) if p.stem in order else len(order),
    )
    if curves:
        parts += [
            "## Training curves",
            "Means over seeds.",
            "\n".join(f"![{plot_caption(p.stem, base)}]({p.name})" for p in curves),
        ]
    learned = [p for p in by_name.values() if p.stem.startswith("coefficients_")]
    if learned:
        parts += [
            "## Learned skip coefficients",
            "One panel per skip (skip 1 is the outermost, merged last, next to the output): the "
            "coefficient's mean over the batch, its min..max as a band, averaged over seeds.",
            "\n".join(f"![{p.stem.removeprefix('coefficients_')}]({p.name})" for p in learned),
        ]
    md = "\n\n".join(parts) + "\n"
    return write_markdown_report(md, report_dir, "ScaleLong comparison"), table
