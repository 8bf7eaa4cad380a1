"""``scalelong sweep``: the stability map. Which learning rates does each skip method survive, and
how does that change with depth?

Every cell (depth, lr, method) trains K seeds (``train.seed + k``) as ordinary runs under
``<out_dir>/<name>-sweep/runs/d12-lr0.01-cs-seed0``. A run that diverges is a result: each run is
judged by :func:`scalelong.studies.divergence.divergence` and the others go on. The report covers every
finished run of the same base config in that folder, so a later call with more seeds or other
learning rates adds to the cells, and the report shows the union (with each cell's seed count).

What is specific to the grid lives here: its cells' configs and runs, the stability and gap
tables, the heatmaps, Fig. 1 by depth and the report. Running, the divergence rule, the
statistics, the per-seed and per-cell summaries and the report's pieces are the
:mod:`scalelong.studies` package's.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from scalelong.diagnostics import metric_names as names
from scalelong.errors import ScaleLongError
from scalelong.runlog.records import write_text_atomic
from scalelong.skips import method_order
from scalelong.studies.basin import Basin, basin_json, basin_section, basin_table, basins
from scalelong.studies.divergence import DEFAULT_RULE, DivergenceRule, causes, criteria
from scalelong.studies.length import length_section
from scalelong.studies.mapfile import agreement_section, read_map
from scalelong.studies.paired import paired_json, paired_section
from scalelong.studies.plots import (
    decoder_blocks,
    plot_fig1_by_depth,
    plot_out_block_norms,
    plot_stability_map,
    series,
)
from scalelong.studies.provenance import provenance_section, write_runs_json
from scalelong.studies.report import (
    digit_headers,
    digit_legend,
    has_digits,
    seeds_note,
    write_markdown_report,
)
from scalelong.studies.running import STUDY_FREE_KEYS, StudyResult, concluded, run_all
from scalelong.studies.statistics import fisher_p, fmt_ci, fmt_contrast, mean_ci, rate_interval
from scalelong.studies.summary import (
    Cell,
    CellSummary,
    StudyRun,
    broken_runs,
    read_run,
    summarise_cells,
)
from scalelong.training.config import (
    Config,
    config_from_dict,
    config_to_dict,
    read_yaml,
    validate,
)
from scalelong.training.runs import RunDir, config_differences

if TYPE_CHECKING:
    from scalelong.studies.cluster import ClusterOptions


def parse_numbers(text: str, flag: str, kind: type = float) -> list:
    """``"2e-3,5e-3"`` -> [0.002, 0.005]: positive, finite, distinct numbers of ``kind``."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ScaleLongError(
            f"{flag} {text!r}: give comma-separated numbers, e.g. {flag} 2e-3,5e-3"
        ) from None
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise ScaleLongError(f"{flag} {text!r}: every value must be a positive number")
    if len(set(values)) != len(values):
        raise ScaleLongError(f"{flag} {text!r} names a value twice")
    return values


def cell_of(cfg: Config) -> Cell:
    depth = cfg.model.uvit.depth if cfg.model.type == "uvit" else None
    return Cell(depth, cfg.optim.lr, cfg.model.skip.method)


def cell_config(base: Config, cell: Cell, seed: int, runs_dir: Path) -> Config:
    """The config of one run of ``cell``, validated (an invalid cell is named in the error)."""
    cfg = copy.deepcopy(base)
    cfg.model.skip.method, cfg.optim.lr, cfg.train.seed = cell.method, cell.lr, seed
    if cell.depth is not None:
        cfg.model.uvit.depth = cell.depth
    cfg.out_dir, cfg.name = str(runs_dir), cell.name(seed)
    try:
        validate(cfg)
    except ScaleLongError as e:
        raise ScaleLongError(f"sweep cell {cfg.name}: {e}") from None
    return cfg


def plan(
    base: Config,
    methods: Sequence[str],
    lrs: Sequence[float],
    depths: Sequence[int] | None,
    seeds: int,
    runs_dir: Path,
) -> list[Config]:
    """Every run of the sweep, each config validated before any run starts; seed by seed, so a
    sweep cut short covers every cell with its first seeds."""
    if seeds < 1:
        raise ScaleLongError(f"--seeds must be >= 1, got {seeds}")
    if depths and base.model.type != "uvit":
        raise ScaleLongError(
            f"--depths sets model.uvit.depth; model.type={base.model.type} has no single depth to "
            f"sweep: run one sweep per size, with overrides of model.{base.model.type}"
        )
    depth_list = list(depths or [cell_of(base).depth])
    return [
        cell_config(base, Cell(d, lr, m), base.train.seed + k, runs_dir)
        for k in range(seeds)
        for d in depth_list
        for lr in lrs
        for m in methods
    ]


def collect(base: Config, runs_dir: Path, rule: DivergenceRule = DEFAULT_RULE) -> dict[Cell, list[StudyRun]]:
    """Every concluded run in ``runs_dir`` of the base config (up to its cell, seed and
    :data:`~scalelong.studies.running.STUDY_FREE_KEYS`), by cell, in seed order."""
    found: dict[Cell, list[tuple[int, StudyRun]]] = {}
    for path in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        run = RunDir(path)
        if not (concluded(run) and run.config_file.is_file()):
            continue
        data = read_yaml(run.config_file)
        try:
            cfg = config_from_dict(data)
            expected = cell_config(base, cell_of(cfg), cfg.train.seed, runs_dir)
        except ScaleLongError:  # a config of another version or base: not part of this map
            continue
        if not config_differences(data, config_to_dict(expected), free=STUDY_FREE_KEYS):
            found.setdefault(cell_of(cfg), []).append((cfg.train.seed, read_run(path, rule)))
    return {cell: [r for _, r in sorted(runs, key=lambda x: x[0])] for cell, runs in found.items()}


def _span(values: Sequence[int]) -> str:
    lo, hi = min(values, default=0), max(values, default=0)
    return f"{lo}" if lo == hi else f"{lo} to {hi}"


def _finite_or_inf(x: float) -> float:
    return x if math.isfinite(x) else math.inf


def stability_table(cells: Sequence[CellSummary], metric: str, found: Sequence[Basin] | None = None) -> str:
    """Per method: the largest stable lr (the basin's one rule,
    :attr:`scalelong.studies.basin.Basin.largest_stable_lr`: no shared seed failed there nor at
    any smaller lr) and the best final ``metric`` among the lrs up to it, mean ± 95% t-interval
    over its seeds. ``found``: the basins of ``cells`` where already computed."""
    lines = [
        f"| method | largest stable lr | best final {metric} (stable lrs) | at lr | seeds |",
        "|---|---|---|---|---|",
    ]
    for b in basins(cells) if found is None else found:
        top = b.largest_stable_lr
        if top is None:
            lines.append(f"| {b.method} | none: the smallest lr that decides failed | n/a | | |")
            continue
        largest = f"{top:g}" + (" (the largest tried)" if top == b.lrs[-1] else "")
        stable = [c for c in cells if c.cell.method == b.method and c.cell.lr <= top]
        best = min(stable, key=lambda c: (_finite_or_inf(mean_ci(c.final)[0]), c.cell.lr))
        lines.append(f"| {b.method} | {largest} | {fmt_ci(best.final)} | {best.cell.lr:g} | {best.count} |")
    return "\n".join(lines)


def least_headroom(values: Sequence[float]) -> str:
    """The seeds' least fp16 headroom: the smallest, and how many seeds fell below 1 (their
    largest value past fp16's 65,504: an fp16 run would have overflowed there)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    below = sum(v < 1 for v in finite)
    return f"{min(finite):.2g}" + (f" ({below}/{len(finite)} below 1)" if below else "")


def cell_table(cells: Sequence[CellSummary], metric: str, real_digits: Mapping | None = None) -> str:
    """Every cell: mean ± 95% interval over seeds of the final ``metric``, the digit score of the
    last evaluation (when the runs logged it: eval.metric fd-mnist; ``real_digits`` is its
    yardstick), feature-norm oscillation, spikes, the least fp16 headroom (where the runs logged
    it: :func:`least_headroom`), and how many seeds diverged by which criterion."""
    digits = has_digits(*(c.values(k) for c in cells for k in ("confident", "entropy")))
    headroom = any(math.isfinite(v) for c in cells for v in c.values("fp16_headroom"))
    extra = digit_headers(real_digits) if digits else []
    head = ["method", "lr", "seeds", f"final {metric}", *extra, "feature growth", "feature-norm osc. std"]
    head += ["loss spikes", *(["least fp16 headroom"] if headroom else [])]
    lines = [
        "| " + " | ".join([*head, "failed", "failure rate (95% CI)"]) + " |",
        "|---" * (len(head) + 2) + "|",
    ]
    for c in sorted(cells, key=lambda c: (method_order(c.cell.method), c.cell.lr)):
        lo, hi = rate_interval(c.diverged, c.count)
        scores = [fmt_ci(c.values("confident"), 2), fmt_ci(c.values("entropy"), 2)] if digits else []
        row = [c.cell.method, f"{c.cell.lr:g}", str(c.count), fmt_ci(c.final), *scores]
        row += [
            fmt_ci(c.values("feature_growth")),
            fmt_ci(c.values("feature_osc")),
            fmt_ci(c.values("spikes")),
        ]
        row += [least_headroom(c.values("fp16_headroom"))] if headroom else []
        row.append(criteria(c.breaks))
        lines.append("| " + " | ".join(row) + f" | {c.diverged / c.count:.0%} ({lo:.0%}-{hi:.0%}) |")
    return "\n".join(lines)


def write_map_json(
    cells: Sequence[CellSummary],
    path: Path,
    key: str,
    basin: Sequence[Basin] = (),
    recorded: Mapping[tuple, list[dict]] | None = None,
) -> Path:
    """Every cell's per-seed numbers as JSON (``final`` is the final ``key``: fd or loss), with
    each value's seed, for tables and plots made elsewhere: the held-out x0 errors (EMA, trained
    weights, untrained model at step 0, mean image), each run's cap l0 of the lr basin with its
    source and its capped value; and ``basin``, per (method, depth), the numbers of the lr basin
    (:func:`scalelong.studies.basin.basin_json`), so the basin tables can be rebuilt from the file."""

    def number(x: float) -> float | None:
        return x if math.isfinite(x) else None  # JSON has no NaN

    read = {(b.depth, b.method, r.lr, r.seed): r for b in (basin or basins(cells)) for r in b.runs}

    def basin_runs(c: CellSummary) -> list:
        return [read[c.cell.depth, c.cell.method, c.cell.lr, s] for s in c.seeds]

    rows = [
        {
            "depth": c.cell.depth,
            "lr": c.cell.lr,
            "method": c.cell.method,
            "seeds": c.count,
            "seed": c.seeds,
            f"final_{key}": [number(x) for x in c.final],
            "feature_norm": [number(x) for x in c.values("feature_norm")],
            "heldout_x0_error": [number(x) for x in c.values("x0_error")],
            "heldout_x0_error_raw": [number(x) for x in c.values("x0_error_raw")],
            "heldout_x0_error_start": [number(x) for x in c.values("x0_error_start")],
            "x0_mean_image": [number(x) for x in c.values("x0_mean_image")],
            "basin_cap": [number(r.cap) for r in basin_runs(c)],
            "basin_cap_source": [r.cap_source for r in basin_runs(c)],
            "basin_value": [number(r.value("ema")) for r in basin_runs(c)],
            "basin_value_raw": [number(r.value("raw")) for r in basin_runs(c)],
            "feature_growth": [number(x) for x in c.values("feature_growth")],
            "feature_norm_osc_std": [number(x) for x in c.values("feature_osc")],
            "loss_spikes": [number(x) for x in c.values("spikes")],
            "fp16_headroom_least": [number(x) for x in c.values("fp16_headroom")],
            "digits_confident": [number(x) for x in c.values("confident")],
            "digits_entropy": [number(x) for x in c.values("entropy")],
            "failed": [
                [{"criterion": d.criterion, "step": d.step, "detail": d.detail} for d in b] for b in c.breaks
            ],
            **(
                {
                    "recorded_criteria": [
                        recorded.get((c.cell.depth, c.cell.lr, c.cell.method, s), []) for s in c.seeds
                    ]
                }
                if recorded
                else {}
            ),
        }
        for c in sorted(cells, key=lambda c: (c.cell.depth or 0, method_order(c.cell.method), c.cell.lr))
    ]
    data = {"metric": key, "rule": DEFAULT_RULE.describe(), "cells": rows, "paired": paired_json(cells)}
    if basin:
        data |= {"basin_weights": "ema (lr_sensitivity_raw: the trained weights)", "basin": basin_json(basin)}
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")
    return path


def cause_section(cells: Sequence[CellSummary]) -> list[str]:
    """The report's failures by cause: per cell that had any, how many runs failed by each cause
    (:func:`scalelong.studies.divergence.cause`: the criterion, and for a run stopped on non-finite
    steps the module where its last skipped step overflowed). Empty without a failure."""
    rows = []
    for c in sorted(cells, key=lambda c: (c.cell.depth or 0, method_order(c.cell.method), c.cell.lr)):
        for why, n in sorted(causes(c.breaks).items()):
            depth = "" if c.cell.depth is None else str(c.cell.depth)
            rows.append(f"| {depth} | {c.cell.lr:g} | {c.cell.method} | {why} | {n}/{c.count} |")
    if not rows:
        return []
    return [
        "## Failures by cause",
        "Each failed run once, by its first criterion: `x0` (it ended no better than the mean image), "
        "`loss` (runs without a held-out error), `nonfinite` with where its last skipped step went "
        "non-finite (`fp16 overflow in forward at MODULE`, a gradient overflow, or a non-finite output "
        "fp32 shows too).",
        "| depth | lr | method | cause | runs |\n|---|---|---|---|---|\n" + "\n".join(rows),
    ]


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
                "" if c is None else f"{c.diverged}/{c.count} diverged" if c.diverged else f"n={c.count}"
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


def fig1_table(cells: Sequence[CellSummary]) -> str:
    """Per method and depth (the cells of one lr): the last logged hidden-feature norm, mean ± 95%
    t-interval over seeds, and its ratio to ``none``'s at that depth (when ``none`` ran), paired by
    seed as in the gap table (:func:`scalelong.studies.statistics.contrast`): the gap the paper says
    grows with depth, in numbers."""
    at = {(c.cell.depth, c.cell.method): c for c in cells}
    depths = sorted({d for d, _ in at}, key=lambda d: d or 0)
    methods = sorted({m for _, m in at}, key=method_order)
    head = [f"depth {d}" if d is not None else "all" for d in depths]
    lines = ["| method | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for m in methods:
        row = []
        for d in depths:
            c, ref = at.get((d, m)), at.get((d, "none"))
            if c is None:
                row.append("")
                continue
            ratio = c.against(ref, "feature_norm", ratio=True) if ref is not None and m != "none" else None
            row.append(fmt_ci(c.values("feature_norm")) + (f" ({ratio.estimate:.2g}x none)" if ratio else ""))
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def gap_table(cells: Sequence[CellSummary], metric: str) -> str:
    """Per depth, each method against ``none`` at the same lr: the ratio of the last hidden-feature
    norms (a geometric mean), the divergence counts (two-sided Fisher exact p), the difference in
    the final ``metric`` (its label) and, where the runs logged it, in the held-out x0 error. Every
    contrast is :func:`scalelong.studies.statistics.contrast`: paired by seed value, Welch's
    (marked unpaired) where the cells share no seed; intervals are 95%. The paper's claim, read
    across the rows: the gap grows with depth."""
    by = {c.cell: c for c in cells}
    x0 = any(math.isfinite(e) for c in cells for e in c.values("x0_error"))
    lines = [
        "| depth | lr | method | feature norm / none (95% CI) | failed vs none (Fisher p) "
        f"| final {metric} - none (95% CI) |" + (" held-out x0 error - none (95% CI) |" if x0 else ""),
        "|---|---|---|---|---|---|" + ("---|" if x0 else ""),
    ]
    for c in sorted(cells, key=lambda c: (c.cell.depth or 0, c.cell.lr, method_order(c.cell.method))):
        ref = by.get(Cell(c.cell.depth, c.cell.lr, "none"))
        if c.cell.method == "none" or ref is None:
            continue
        p = fisher_p(c.diverged, c.count, ref.diverged, ref.count)
        cols = [
            "" if c.cell.depth is None else str(c.cell.depth),
            f"{c.cell.lr:g}",
            c.cell.method,
            fmt_contrast(c.against(ref, "feature_norm", ratio=True)),
            f"{c.diverged}/{c.count} vs {ref.diverged}/{ref.count} (p {p:.2g})",
            fmt_contrast(c.against(ref, f"final_{c.metric}")),
        ]
        if x0:
            cols.append(fmt_contrast(c.against(ref, "x0_error")))
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


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
    return parts


def write_sweep_report(
    base: Config,
    runs: Mapping[Cell, Sequence[StudyRun]] | None,
    sweep_dir: Path,
    failed: Sequence[StudyRun] = (),
    rule: DivergenceRule = DEFAULT_RULE,
    fig1_lr: float | None = None,
    cells: Sequence[CellSummary] | None = None,
    extra: Sequence[str] = (),
    recorded: Mapping[tuple, list[dict]] | None = None,
) -> tuple[Path, str]:
    """report.md, one heatmap per depth, the paper's Fig. 1 by depth at ``fig1_lr`` (None: the
    smallest lr; :func:`fig1_section`), report.html, map.json and runs.json in ``sweep_dir``; returns
    the path of report.md and the stability tables (markdown). Without ``runs`` (their folders are
    gone), from ``cells`` alone (:func:`scalelong.studies.mapfile.read_map`): the sections that need
    the runs' records (Fig. 1, the gap by length, runs.json) are left out, and ``extra`` sections
    (what the map lacks, the agreement of rules) follow the tables."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    key, metric = (names.FD, f"FD ({base.eval.metric})") if base.eval.every > 0 else (names.LOSS, "loss")
    if cells is None:
        cells = summarise_cells(runs or {}, key)
    seeds = [c.count for c in cells]
    methods = sorted({c.cell.method for c in cells}, key=method_order)
    found = basins(cells)  # once: every table of the report reads these
    parts = [
        f"# ScaleLong stability map: {', '.join(methods)}",
        f"{base.model.type}, data {base.data.name}, {base.train.steps} steps, batch "
        f"{base.train.batch_size}, warm-up {base.optim.warmup_steps} steps; {len(cells)} cells with "
        f"{_span(seeds)} seed(s) each: every finished run of this config in this folder. The colour is "
        f"the final {metric}, mean over seeds (lower is better); values are means ± the half-width of "
        "a 95% t-interval. A learning rate is **stable** for a method when no seed failed there or at "
        "any smaller learning rate, counted on the seeds every method ran at that lr.",
        rule.describe(),
    ]
    if runs is not None:
        parts += provenance_section(runs)
    if min(seeds, default=0) < 5:
        parts.append(seeds_note(min(seeds, default=0)))
    if has_digits(*(c.values("confident") for c in cells)):
        parts.append(digit_legend())
    parts += extra
    tables = []
    for depth in sorted({c.cell.depth for c in cells}, key=lambda d: d or 0):
        mine = [c for c in cells if c.cell.depth == depth]
        label = "" if depth is None else f"depth {depth}"
        png = draw_map(
            mine, sweep_dir / f"stability{'' if depth is None else f'_d{depth}'}.png", label, metric
        )
        table = stability_table(mine, metric, [b for b in found if b.depth == depth])
        tables.append((f"{label}:\n\n" if label else "") + table)
        parts += [f"## {label or 'All cells'}", f"![{png.stem}]({png.name})", table, cell_table(mine, metric)]
    gaps = gap_table(cells, metric)
    if gaps:
        parts += [
            "## The gap to `none`, by depth",
            "Each method against `none` in the same depth and lr. The paper says the gap grows with "
            "depth: a feature-norm ratio further below 1, fewer failures, a lower final "
            f"{metric} in the deeper rows. The last logged hidden-feature norm of each seed enters "
            "as a geometric mean. Ratios and differences are paired by seed over the seeds both "
            "cells ran (a seed gives every method the same batches and noise and, but for LS's gates, "
            "the same initial weights); where the cells share no seed they are unpaired (Welch's "
            "interval, marked), and one shared seed gives its one value without an interval. The "
            "held-out x0 error is the EMA "
            "model's on fixed held-out images, averaged over the noise levels (`noise/x0_mse@L`), "
            "less noisy than the last training loss. An interval that spans 1 (ratio) or 0 "
            "(difference) is no evidence of a gap.",
            gaps,
        ]
    parts += cause_section(cells)
    parts += paired_section(cells)
    basin_parts, _ = basin_section(cells, sweep_dir, found)
    parts += basin_parts
    for depth in sorted({b.depth for b in found}, key=lambda d: d or 0):
        mine = [b for b in found if b.depth == depth]
        if len(mine[0].grid) > 1 and any(b.logged("ema") for b in mine):
            label = "lr basin" + ("" if depth is None else f", depth {depth}")
            tables.append(f"{label}:\n\n{basin_table(mine)}")
    if runs is not None:
        parts += fig1_section(runs, sweep_dir, fig1_lr)
        if (lr := figure_lr(runs, fig1_lr)) is not None:
            parts += length_section(runs, sweep_dir, lr)
        broken = broken_runs([r for rs in runs.values() for r in rs] + list(failed))
        if broken:
            parts += ["## Runs that failed", "\n".join(broken)]
        write_runs_json(base, runs, sweep_dir / "runs.json")
    basin = found if len({c.cell.lr for c in cells}) > 1 else ()
    write_map_json(cells, sweep_dir / "map.json", key, basin, recorded)
    report = write_markdown_report("\n\n".join(parts) + "\n", sweep_dir, "ScaleLong stability map")
    return report, "\n\n".join(tables)


def run_sweep(
    base: Config,
    methods: Sequence[str],
    lrs: Sequence[float],
    depths: Sequence[int] | None,
    seeds: int,
    sweep_dir: Path,
    jobs: int | None = 1,
    progress: bool = True,
    train_kwargs: Mapping | None = None,
    rule: DivergenceRule = DEFAULT_RULE,
    fig1_lr: float | None = None,
    gpus_per_run: int = 1,
    cluster: ClusterOptions | None = None,
) -> StudyResult:
    """Train every cell's seeds (reusing finished runs; ``jobs`` at a time, ``gpus_per_run`` GPUs
    each where there are GPUs, or as a cluster's jobs: :func:`scalelong.studies.running.run_all`),
    then write the map of every finished run of this config in ``sweep_dir``. A diverged run is
    a result; a run that fails is reported and left out. ``fig1_lr``: the lr of the report's
    Fig. 1 (one of ``lrs``; None: the smallest). Jobs submitted without waiting
    (``cluster.wait`` False) write no report: :func:`report_sweep` writes it later."""
    check_fig1_lr(fig1_lr, lrs)
    runs_dir = sweep_dir / "runs"
    cfgs = plan(base, methods, lrs, depths, seeds, runs_dir)
    outcomes = run_all(cfgs, jobs, progress, train_kwargs, gpus_per_run=gpus_per_run, cluster=cluster)
    if cluster is not None and not cluster.wait:  # the jobs have only just been submitted
        return StudyResult(sweep_dir / "report.md", "", outcomes, reported=False)
    failed = [
        read_run(c.run_dir, error=o.message)
        for c, o in zip(cfgs, outcomes, strict=True)
        if o.status == "failed"
    ]
    report, tables = write_sweep_report(base, collect(base, runs_dir, rule), sweep_dir, failed, rule, fig1_lr)
    return StudyResult(report, tables, outcomes)


def report_sweep(
    base: Config,
    sweep_dir: Path,
    rule: DivergenceRule = DEFAULT_RULE,
    fig1_lr: float | None = None,
    warn=print,
) -> Path:
    """Write the report of every finished run of ``base`` in ``sweep_dir`` without training:
    after a sweep that was cut short (a time limit, a crash), the map of what finished. Where the
    run folders are gone but the sweep's map.json is there, the report is made from it
    (:func:`scalelong.studies.mapfile.read_map`, judged by today's rule), with one line through
    ``warn`` naming what the file lacks. Returns the path of report.md."""
    runs = collect(base, sweep_dir / "runs", rule)
    if runs:
        return write_sweep_report(base, runs, sweep_dir, rule=rule, fig1_lr=fig1_lr)[0]
    saved = sweep_dir / "map.json"
    if not saved.is_file():
        raise ScaleLongError(f"{sweep_dir / 'runs'} holds no finished run of this config: nothing to report")
    cells, lacking, recorded = read_map(saved)
    extra = agreement_section(cells, recorded)
    if lacking:
        said = ", ".join(lacking)
        warn(f"{saved}: no run folders, a map.json of an older format without {said}; reported without them")
        extra = [
            f"Made from `map.json` alone (the run folders are not here); it lacks {said}, so the figures "
            "over steps and the runs' provenance are left out.",
            *extra,
        ]
    return write_sweep_report(
        base, None, sweep_dir, rule=rule, fig1_lr=fig1_lr, cells=cells, extra=extra, recorded=recorded
    )[0]
