"""The figures of a sweep's report: one stability heatmap per depth, and the paper's Fig. 1 by
depth at one learning rate (with the out-blocks' norms, to locate a blow-up, and the peak |value|
along the network, to see what fp16 would overflow at)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from scalelong.diagnostics import metric_names as names
from scalelong.diagnostics.overflow import FP16_MAX
from scalelong.errors import ScaleLongError
from scalelong.skips import method_order
from scalelong.studies.magnitude import decoder_growth, median_profile, peak_absmax, reached
from scalelong.studies.plots import (
    decoder_blocks,
    plot_fig1_by_depth,
    plot_magnitude,
    plot_out_block_norms,
    plot_stability_map,
    series,
)
from scalelong.studies.statistics import contrast, fmt_contrast, mean_ci
from scalelong.studies.summary import Cell, CellSummary, StudyRun, summarise_cells, summarise_run
from scalelong.studies.sweep.beside import overflowed
from scalelong.studies.sweep.tables import fig1_table


def draw_map(cells: Sequence[CellSummary], path: Path, title: str, metric: str) -> Path:
    """The heatmap of one depth: methods x lrs, coloured by the mean final ``metric``."""
    methods = sorted({c.cell.method for c in cells}, key=method_order)
    lrs = sorted({c.cell.lr for c in cells})
    at = {(c.cell.method, c.cell.lr): c for c in cells}
    values, notes, marked = [], [], []
    for m in methods:
        row = [at.get((m, lr)) for lr in lrs]
        values.append([mean_ci(c.final)[0] if c else math.nan for c in row])
        notes.append(
            [
                "" if c is None else f"{c.diverged}/{c.count} failed" if c.diverged else f"n={c.count}"
                for c in row
            ]
        )
        marked.append([bool(c and c.diverged) for c in row])
    return plot_stability_map(values, notes, marked, methods, [f"{lr:g}" for lr in lrs], path, title, metric)


def _same_lr(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)


def check_fig1_lr(fig1_lr: float | None, lrs: Sequence[float]) -> None:
    """Before any run: the Fig. 1 learning rate must be one the sweep trains."""
    if fig1_lr is not None and not any(_same_lr(fig1_lr, lr) for lr in lrs):
        swept = ",".join(f"{lr:g}" for lr in lrs)
        raise ScaleLongError(f"--fig1-lr {fig1_lr:g} is not one of --lrs {swept}; choose one of them")


def figure_lr(runs: Mapping[Cell, Sequence[StudyRun]], fig1_lr: float | None) -> float | None:
    """The lr the report's figures over steps are drawn at: ``fig1_lr``, else the map's smallest
    (None for a map without cells)."""
    return fig1_lr if fig1_lr is not None else min((c.lr for c in runs), default=None)


def fig1_section(
    runs: Mapping[Cell, Sequence[StudyRun]], sweep_dir: Path, fig1_lr: float | None = None
) -> list[str]:
    """The report's picture of the paper's Fig. 1 at one learning rate (``fig1_lr``; None: the
    smallest of the map): the hidden-feature norm against step, one panel per depth, one line
    per method (:func:`scalelong.studies.plots.plot_fig1_by_depth`), its last values in a table, and per
    depth the norm of every out-block, one panel per method, to locate a blow-up."""
    heading = "## Fig. 1: hidden-feature norm by depth"
    lr = figure_lr(runs, fig1_lr)
    cells: dict[Cell, list[StudyRun]] = {}  # the cells drawn, each with its seeds' logged runs
    for c, rs in sorted(runs.items(), key=lambda kv: (kv[0].depth or 0, method_order(kv[0].method))):
        logged = [r for r in rs if r.records]
        if lr is not None and _same_lr(c.lr, lr) and logged:
            cells[c] = logged
    chosen = {(c.depth, c.method): rs for c, rs in cells.items()}
    if not chosen:
        return [heading, f"No finished run at lr {lr:g} to draw." if lr is not None else "No finished run."]
    if not any(series(r.records, names.FEATURE_NORM)[0] for rs in chosen.values() for r in rs):
        return [heading, "The runs logged no hidden-feature norm: set diagnostics.every > 0 to draw it."]
    which = "the smallest of the map" if fig1_lr is None else "chosen for this figure"
    png = plot_fig1_by_depth({k: [r.records for r in rs] for k, rs in chosen.items()}, sweep_dir / "fig1.png")
    parts = [
        heading,
        f"As in the paper's Fig. 1, at lr {lr:g} ({which}): the norm of the hidden features (mean over "
        "the blocks) against step, one panel per depth, one line per method. The line is the mean over "
        "the method's seeds and the band spans the seeds' **min..max** (their spread, not a confidence "
        "interval); non-finite values are left out, so a diverged seed's values end where it broke. A "
        "log y-axis means the norms span more than two decades. The paper: without scaling (`none`) "
        "the norm grows during training, the more so the deeper the network; scaled long skips keep "
        "it down.",
        f"![Fig. 1 at lr {lr:g}]({png.name})",
        "The last logged hidden-feature norm (mean over seeds ± the half-width of a 95% t-interval; "
        "in brackets its ratio to `none`'s at the same depth, the geometric mean over the seeds both "
        "ran, as in the gap table):",
        fig1_table(summarise_cells(cells, names.LOSS)),
    ]
    views = []
    for depth in sorted({d for d, _ in chosen}, key=lambda d: d or 0):
        mine = {m: [r.records for r in rs] for (d, m), rs in chosen.items() if d == depth}
        if not decoder_blocks([rec for rr in mine.values() for recs in rr for rec in recs]):
            continue
        label = "all cells" if depth is None else f"depth {depth}"
        name = "out_blocks.png" if depth is None else f"out_blocks_d{depth}.png"
        png = plot_out_block_norms(mine, sweep_dir / name, title=f"{label}, lr {lr:g}")
        views.append(f"![out-block feature norms, {label}, lr {lr:g}]({png.name})")
    if views:
        parts += [
            "### Where it grows: the out-blocks",
            "Per depth, the feature norm of each out-block against step (mean over seeds), one panel per "
            "method on shared axes; the colour runs from the first out-block (dark, merging the innermost "
            "skip) to the last (bright, merging skip 1, next to the output).",
            *views,
        ]
    return parts + magnitude_parts(chosen, lr, sweep_dir)


def _median(values: Sequence[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    return f"{statistics.median(finite):.3g}" if finite else "n/a"


def magnitude_parts(
    chosen: Mapping[tuple[int | None, str], Sequence[StudyRun]], lr: float, sweep_dir: Path
) -> list[str]:
    """Per depth at ``lr``: the peak |value| of every block's output along the network, one line per
    method (:func:`scalelong.studies.plots.magnitude_figure`), and a table of where it is largest:
    the skips' inputs, the middle block, the last decoder block, the growth from the middle to the
    last, and how many seeds reached fp16's 65,504 (or overflowed). Nothing where the runs logged
    no block absmax."""
    figures, rows, bases = [], [], set()  # bases: each depth's first method, what its ratios divide by
    for depth in sorted({d for d, _ in chosen}, key=lambda d: d or 0):
        runs = {m: rs for (d, m), rs in chosen.items() if d == depth}
        mine = {m: [r.records for r in rs] for m, rs in runs.items()}
        profiles = {m: median_profile(recs) for m, recs in mine.items()}
        profiles = {m: p for m, p in profiles.items() if p[0]}
        if not profiles:
            continue
        label = "all cells" if depth is None else f"depth {depth}"
        name = "magnitude.png" if depth is None else f"magnitude_d{depth}.png"
        png = plot_magnitude(profiles, sweep_dir / name, limit=FP16_MAX, title=f"{label}, lr {lr:g}")
        figures.append(f"![peak |value| along the network, {label}, lr {lr:g}]({png.name})")
        growth = {  # per method and seed: (skips' inputs, middle block, last decoder block), read once
            m: {r.seed: g for r in rs if (g := decoder_growth(peak_absmax(r.records)))}
            for m, rs in runs.items()
        }
        last = {m: {seed: g[2] for seed, g in by_seed.items()} for m, by_seed in growth.items()}
        base = next(iter(runs))  # the first in method order: none where it ran
        bases.add(base)
        for method, recs in mine.items():
            grown = list(growth[method].values())
            if not grown:
                continue
            past = sum(reached(r.records, FP16_MAX) or overflowed(summarise_run(r)) for r in runs[method])
            a, b = last[method], last[base]
            ratio = (
                ""
                if method == base
                else fmt_contrast(
                    contrast(list(a.values()), list(b.values()), list(a), list(b), ratio=True), unit="x"
                )
            )
            rows.append(
                f"| {'' if depth is None else depth} | {method} | {len(recs)} | "
                f"{_median([g[0] for g in grown])} | {_median([g[1] for g in grown])} | "
                f"{_median([g[2] for g in grown])} | {ratio} | {_median([g[2] / g[1] for g in grown])}x | "
                f"{past}/{len(recs)} |"
            )
    if not figures:
        return []
    divisor = bases.pop() if len(bases) == 1 else "the first method of its depth"
    return [
        "### How large the values get: the peak |value| along the network",
        f"At lr {lr:g}, the largest |value| each block's output reached over the run (at the logged "
        "steps), median over the seeds with their spread as a band, the blocks in forward order: the "
        "encoder blocks' outputs are the long skips' inputs; each decoder block merges a skip into the "
        "decoder stream. fp16 overflows where a value passes 65,504 (dashed). The table: the median "
        "over seeds of the largest encoder peak (the skips' inputs), the middle block's, the last "
        "decoder block's (each seed's largest finite value) with its ratio to the first method's "
        "(geometric mean over the seeds both ran, paired by seed, 95% interval: one that spans 1 is no "
        "evidence of a gap), and of each seed's growth from the middle to the last; the seeds whose "
        "values reached 65,504 at a logged step or whose fp16 forward overflowed (the trainer's record "
        "of the steps it skipped).",
        *figures,
        "| depth | method | seeds | skips' inputs | middle block | last decoder block | last decoder block / "
        f"{divisor} (95% CI) | growth middle to last | reached 65,504 or overflowed |\n"
        + "|---" * 9
        + "|\n"
        + "\n".join(rows),
    ]
