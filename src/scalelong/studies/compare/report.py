"""A comparison's report: report.md and report.html with the summary table and its reading, the
sample grids, the figures and the training curves, in the comparison's folder."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scalelong.metrics.fd_mnist import real_digit_score
from scalelong.studies.compare.reading import reading
from scalelong.studies.compare.summary import summarise
from scalelong.studies.compare.table import summary_table
from scalelong.studies.divergence import DEFAULT_RULE
from scalelong.studies.plots import plot_digit_score, write_plots
from scalelong.studies.report import (
    DIGIT_HEADER,
    FIGURE_CAPTIONS,
    digit_legend,
    has_digits,
    plot_caption,
    sample_grid_section,
    write_markdown_report,
)
from scalelong.studies.summary import StudyRun, average_records, broken_runs
from scalelong.training.config import Config


@dataclass(frozen=True)
class ComparisonReport:
    """A comparison's report as written: its summary and reading are computed once, for the file
    and for what the command prints."""

    path: Path  # report.md (report.html beside it)
    table: str  # the summary table, markdown
    reading: str  # the table in plain sentences


def write_comparison_report(
    studies: Mapping[str, Sequence[StudyRun]], baseline: str, report_dir: Path, base: Config
) -> ComparisonReport:
    """report.md, PNG plots (means over seeds), the sample grids and a self-contained report.html in
    ``report_dir``; returns the path of report.md, the summary table (markdown) and its reading.

    The report reads top down: the summary table and its reading in plain sentences
    (:func:`scalelong.studies.compare.reading.reading`), the final samples of every method side by
    side, Fig. 1 (hidden-feature norm), the error per noise level, then the runs that broke, the
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
    header = (
        f"{network_words(base.model)}, data {base.data.name}, {base.train.steps} steps, batch "
        f"{base.train.batch_size}, {seeds} seed(s) from {base.train.seed}. Values are means over seeds "
        f"± the half-width of a 95% t-interval. The change in final FD and the speed-up against {baseline} "
        "are geometric means of the per-seed ratios over the seeds both ran, with 95% intervals (marked "
        "unpaired, Welch's, where they share no seed). FD is the Frechet distance "
        f"({base.eval.metric}) of EMA samples."
    )
    parts = [f"# ScaleLong comparison: {', '.join(runs)}", header, table]
    # Right under the table, so it is read first; it carries the seed-count warning too.
    text = reading(summaries, baseline, base.eval.every, base.train.steps, seeds)
    parts.append(text)
    if DIGIT_HEADER in table:
        parts.append(digit_legend())
    parts += sample_grid_section(studies, report_dir, base)
    figures = (
        ("feature_norm", "Fig. 1: hidden-feature norm"),
        ("magnitude", "How large the values get along the network"),
        ("noise_levels", "Noise levels"),
    )
    for name, heading in figures:
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
    return ComparisonReport(write_markdown_report(md, report_dir, "ScaleLong comparison"), table, text)


def network_words(model) -> str:
    """The compared network in a few words: its type and the size that tells two of a kind apart."""
    sizes = {
        "uvit": lambda c: f"depth {c.depth}, width {c.embed_dim}",
        "unet": lambda c: (
            f"{c.base_channels} channels x {list(c.channel_mult)}, "
            f"{c.num_res_blocks} residual block(s) a level"
        ),
    }
    size = sizes.get(model.type)
    return f"{model.type} ({size(getattr(model, model.type))})" if size else model.type


def write_report(
    studies: Mapping[str, Sequence[StudyRun]], baseline: str, report_dir: Path, base: Config
) -> tuple[Path, str]:
    """The report of :func:`write_comparison_report`; returns the path of report.md and the summary
    table (markdown)."""
    written = write_comparison_report(studies, baseline, report_dir, base)
    return written.path, written.table
