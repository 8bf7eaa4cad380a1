"""The gap by length: does a method's lead over ``none`` open as training goes on?

The paper's Fig. 1 shows the methods separating only after about 10k iterations at a constant lr.
A study whose runs probe the held-out x0 error more than once (``diagnostics.noise_levels_every``)
can read that directly: the error at each probe, per method, and its difference to ``none`` paired
by seed at the same step, so a gap that opens with length shows as a difference that grows along a
row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from scalelong.skips import method_order
from scalelong.studies.heldout import heldout_x0_series
from scalelong.studies.markdown import markdown_table
from scalelong.studies.plots import plot_fig1_by_depth
from scalelong.studies.statistics import contrast, fmt_ci, fmt_contrast
from scalelong.studies.summary import Cell, StudyRun

KEY = "heldout_x0"  # the probe's level-mean, as records of its own for the figure


def probes(run: StudyRun) -> dict[int, float]:
    """The run's held-out x0 error (EMA, mean over the noise levels) at each probe after step 0."""
    return {s: v for s, v in zip(*heldout_x0_series(run.records), strict=True) if s > 0}


def probed_often(runs: Mapping[Cell, Sequence[StudyRun]]) -> bool:
    """Whether some run probed the held-out error at two steps or more after step 0."""
    return any(len(probes(r)) >= 2 for rs in runs.values() for r in rs)


def length_table(runs: Mapping[Cell, Sequence[StudyRun]]) -> str:
    """One depth and lr's cells: per method (rows) and probe step (columns), the held-out x0 error
    (mean ± the half-width of a 95% t-interval over seeds) and, for each method but ``none``, its
    difference to ``none`` at that step, paired by seed (:func:`contrast`)."""
    by_method = {c.method: [(r.seed, probes(r)) for r in rs] for c, rs in runs.items()}
    steps = sorted({s for rs in by_method.values() for _, p in rs for s in p})
    rows = []
    ref = by_method.get("none")  # [(seed, {step: error})]
    for method in sorted(by_method, key=method_order):
        row = [method]
        for s in steps:
            here = [(seed, p[s]) for seed, p in by_method[method] if s in p]
            base = [(seed, p[s]) for seed, p in ref or () if s in p]
            cell = fmt_ci([v for _, v in here]) if here else ""
            if here and base and method != "none":
                (seeds, values), (base_seeds, base_values) = (zip(*x, strict=True) for x in (here, base))
                diff = contrast(values, base_values, seeds, base_seeds)
                cell += f"; - none {fmt_contrast(diff)}"
            row.append(cell)
        rows.append(row)
    return markdown_table(["method", *(f"step {s:,}" for s in steps)], rows)


def length_section(runs: Mapping[Cell, Sequence[StudyRun]], sweep_dir: Path, lr: float) -> list[str]:
    """The report's section on the gap by length at ``lr``: the held-out x0 error against step,
    one panel per depth and one line per method (heldout.png; mean over seeds, band min..max),
    and per depth :func:`length_table`. Empty where no run probed twice after step 0."""
    mine = {c: [r for r in rs if r.records] for c, rs in runs.items() if math.isclose(c.lr, lr, rel_tol=1e-9)}
    if not probed_often(mine):
        return []
    curves = {  # from the first probe after step 0: the untrained model's error would flatten the rest
        (c.depth, c.method): [[{"step": s, KEY: v} for s, v in probes(r).items()] for r in rs]
        for c, rs in sorted(mine.items(), key=lambda kv: (kv[0].depth or 0, method_order(kv[0].method)))
    }
    png = plot_fig1_by_depth(
        curves, sweep_dir / "heldout.png", key=KEY, log=False, ylabel="held-out x0 error (EMA)"
    )
    parts = [
        "## The gap by length: held-out x0 error over training",
        f"At lr {lr:g}: the EMA model's x0 error on the fixed held-out images, averaged over the noise "
        "levels, at every probe after step 0 (`diagnostics.noise_levels_every`; the untrained model's "
        "error, several times larger, is left out so the axis resolves the trained runs). The line is the "
        "mean over seeds, the band their min..max. In the tables, mean ± the half-width of a "
        "95% t-interval and, after `- none`, the difference to `none` at the same step, paired by seed: "
        "a gap that opens with length grows along its row.",
        f"![held-out x0 error over training at lr {lr:g}]({png.name})",
    ]
    for depth in sorted({c.depth for c in mine}, key=lambda d: d or 0):
        cells = {c: rs for c, rs in mine.items() if c.depth == depth}
        parts += [f"Depth {depth}:" if depth is not None else "All cells:", length_table(cells)]
    return parts
