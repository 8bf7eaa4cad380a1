"""A sweep's report: report.md and report.html, with its heatmaps, tables and figures, map.json and
runs.json, in the sweep's folder. Every table of it reads the cells' basins computed once here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from scalelong.diagnostics import metric_names as names
from scalelong.skips import method_order
from scalelong.studies.divergence import DEFAULT_RULE, DivergenceRule
from scalelong.studies.provenance import provenance_section, write_runs_json
from scalelong.studies.report import digit_legend, has_digits, seeds_note, write_markdown_report
from scalelong.studies.summary import Cell, CellSummary, StudyRun, broken_runs, summarise_cells
from scalelong.studies.sweep.basin import basin_section, basin_table, basins
from scalelong.studies.sweep.beside import Beside, beside_record, beside_section, sweep_precision
from scalelong.studies.sweep.figures import draw_map, fig1_section, figure_lr
from scalelong.studies.sweep.length import length_section
from scalelong.studies.sweep.mapfile import write_map_json
from scalelong.studies.sweep.paired import paired_section
from scalelong.studies.sweep.tables import cause_section, cell_table, gap_table, seeds_table, stability_table
from scalelong.training.config import Config


def _span(values: Sequence[int]) -> str:
    lo, hi = min(values, default=0), max(values, default=0)
    return f"{lo}" if lo == hi else f"{lo} to {hi}"


def gap_section(cells: Sequence[CellSummary], metric: str) -> list[str]:
    """The report's gap to ``none`` by depth: how to read it, then
    :func:`~scalelong.studies.sweep.tables.gap_table`. Empty where no cell has ``none`` beside it."""
    gaps = gap_table(cells, metric)
    if not gaps:
        return []
    return [
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
    beside: Beside | None = None,
) -> tuple[Path, str]:
    """report.md, one heatmap per depth, the paper's Fig. 1 by depth at ``fig1_lr`` (None: the
    smallest lr; :func:`~scalelong.studies.sweep.figures.fig1_section`), report.html, map.json and
    runs.json in ``sweep_dir``; returns the path of report.md and the stability tables (markdown).
    Without ``runs`` (their folders are gone), from ``cells`` alone
    (:func:`scalelong.studies.sweep.mapfile.read_map`): the sections that need the runs' records
    (Fig. 1, the gap by length, runs.json) are left out, and ``extra`` sections (what the map
    lacks, the agreement of rules) follow the tables. ``beside``: the map of the same grid in another
    precision, set beside this one (:func:`scalelong.studies.sweep.beside.beside_section`) and
    recorded in map.json."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    key, metric = (names.FD, f"FD ({base.eval.metric})") if base.eval.every > 0 else (names.LOSS, "loss")
    if cells is None:
        cells = summarise_cells(runs or {}, key)
    elif cells and cells[0].metric != key:  # a map read back keeps its own metric, whatever the config says
        key, metric = (names.FD, "FD") if cells[0].metric == names.FD else (names.LOSS, "loss")
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
    if held := seeds_table(cells):
        parts += ["The cells ran different seeds; the runs, by the seeds they ran:", held]
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
    parts += gap_section(cells, metric)
    parts += cause_section(cells)
    parts += paired_section(cells)
    basin_parts, _ = basin_section(cells, sweep_dir, found)
    parts += basin_parts
    for depth in sorted({b.depth for b in found}, key=lambda d: d or 0):
        mine = [b for b in found if b.depth == depth]
        if len(mine[0].grid) > 1 and any(b.logged("ema") for b in mine):
            label = "lr basin" + ("" if depth is None else f", depth {depth}")
            tables.append(f"{label}:\n\n{basin_table(mine)}")
    if beside is not None:
        parts += beside_section(cells, sweep_precision(cells, base.train.mixed_precision), beside, sweep_dir)
    if runs is not None:
        parts += fig1_section(runs, sweep_dir, fig1_lr)
        if (lr := figure_lr(runs, fig1_lr)) is not None:
            parts += length_section(runs, sweep_dir, lr)
        broken = broken_runs([r for rs in runs.values() for r in rs] + list(failed))
        if broken:
            parts += ["## Runs that failed", "\n".join(broken)]
        write_runs_json(base, runs, sweep_dir / "runs.json")
    else:  # from map.json: each failed run with today's verdict on it, as a run's folder would give it
        broken = [f"- `{c.cell.name(r.seed)}`: {d}" for c in cells for r in c.runs for d in r.breaks]
        if broken:
            parts += ["## Runs that failed", "\n".join(broken)]
    record = beside_record(beside, sweep_dir) if beside is not None else None
    write_map_json(cells, sweep_dir / "map.json", key, found, recorded, record)
    report = write_markdown_report("\n\n".join(parts) + "\n", sweep_dir, "ScaleLong stability map")
    return report, "\n\n".join(tables)
