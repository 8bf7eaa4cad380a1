"""The tables of a sweep's report: per depth the stability of each method and every cell, the gap
to ``none`` by depth, the hidden-feature norm of Fig. 1 by depth, and the failures by cause."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from scalelong.skips import method_order
from scalelong.studies.divergence import causes, criteria
from scalelong.studies.markdown import markdown_table
from scalelong.studies.report import digit_headers, has_digits
from scalelong.studies.statistics import fisher_p, fmt_ci, fmt_contrast, mean_ci, rate_interval
from scalelong.studies.summary import Cell, CellSummary
from scalelong.studies.sweep.basin import Basin, basins
from scalelong.studies.sweep.edges import seed_list


def _finite_or_inf(x: float) -> float:
    return x if math.isfinite(x) else math.inf


def stability_table(cells: Sequence[CellSummary], metric: str, found: Sequence[Basin] | None = None) -> str:
    """Per method: the largest stable lr (the basin's one rule,
    :attr:`scalelong.studies.sweep.basin.Basin.largest_stable_lr`: no shared seed failed there nor
    at any smaller lr) and the best final ``metric`` among the lrs up to it, mean ± 95% t-interval
    over its seeds. ``found``: the basins of ``cells`` where already computed."""
    lines = [
        f"| method | largest stable lr | best final {metric} (stable lrs) | at lr | seeds |",
        "|---|---|---|---|---|",
    ]
    for b in basins(cells) if found is None else found:
        top = b.largest_stable_lr
        if top is None:
            edge = b.stable_edge() if not b.deciding_counts() else "none: the smallest lr that decides failed"
            lines.append(f"| {b.method} | {edge} | n/a | | |")
            continue
        stable = [c for c in cells if c.cell.method == b.method and c.cell.lr <= top]
        best = min(stable, key=lambda c: (_finite_or_inf(mean_ci(c.final)[0]), c.cell.lr))
        lines.append(
            f"| {b.method} | {b.stable_edge()} | {fmt_ci(best.final)} | {best.cell.lr:g} | {best.count} |"
        )
    return "\n".join(lines)


def least_headroom(values: Sequence[float]) -> str:
    """The seeds' least fp16 headroom: the smallest, and how many seeds fell below 1 (their
    largest value past fp16's 65,504: an fp16 run would have overflowed there)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    below = sum(v < 1 for v in finite)
    return f"{min(finite):.2g}" + (f" ({below}/{len(finite)} below 1)" if below else "")


def growth_text(values: Sequence[float]) -> str:
    """A cell's feature growth: mean ± 95% interval over the seeds whose features stayed finite, and
    how many seeds' ended non-finite (an infinite growth, which no mean can hold)."""
    blown = sum(math.isinf(v) for v in values)
    text = fmt_ci([v for v in values if math.isfinite(v)])
    if not blown:
        return text
    return ("" if text == "n/a" else f"{text}; ") + f"{blown}/{len(values)} non-finite"


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
            growth_text(c.values("feature_growth")),
            fmt_ci(c.values("feature_osc")),
            fmt_ci(c.values("spikes")),
        ]
        row += [least_headroom(c.values("fp16_headroom"))] if headroom else []
        row.append(criteria(c.breaks))
        lines.append("| " + " | ".join(row) + f" | {c.diverged / c.count:.0%} ({lo:.0%}-{hi:.0%}) |")
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


def fig1_table(cells: Sequence[CellSummary]) -> str:
    """Per method and depth (the cells of one lr): the last logged hidden-feature norm, mean ± 95%
    t-interval over seeds, and its ratio to ``none``'s at that depth (when ``none`` ran), paired by
    seed as in the gap table (:func:`scalelong.studies.statistics.contrast`): the gap the paper says
    grows with depth, in numbers."""
    at = {(c.cell.depth, c.cell.method): c for c in cells}
    depths = sorted({d for d, _ in at}, key=lambda d: d or 0)
    methods = sorted({m for _, m in at}, key=method_order)
    head = [f"depth {d}" if d is not None else "all" for d in depths]
    rows = []
    for m in methods:
        row = [m]
        for d in depths:
            c, ref = at.get((d, m)), at.get((d, "none"))
            if c is None:
                row.append("")
                continue
            ratio = c.against(ref, "feature_norm", ratio=True) if ref is not None and m != "none" else None
            row.append(fmt_ci(c.values("feature_norm")) + (f" ({ratio.estimate:.2g}x none)" if ratio else ""))
        rows.append(row)
    return markdown_table(["method", *head], rows)


# How to read a cause of the failures-by-cause tables.
CAUSES_READ = (
    "Each failed run once, by its first criterion: `x0` (it ended no better than the mean image; `x0 "
    "after a loss collapse`: on the way its smoothed loss rose past 2x its lowest and stayed there to "
    "the end, a spike it did not recover from), "
    "`loss` (runs without a held-out error), `nonfinite` with where its last skipped step went "
    "non-finite (`fp16 overflow in forward at MODULE`, a gradient overflow, or a non-finite output "
    "fp32 shows too)."
)


def cause_table(cells: Sequence[CellSummary], precision: str = "") -> str:
    """Per cell that had any failure, how many runs failed by each cause
    (:func:`scalelong.studies.divergence.cause`), one row a cause; ``precision`` names the runs' in
    the header. Empty without a failure."""
    rows = []
    for c in sorted(cells, key=lambda c: (c.cell.depth or 0, method_order(c.cell.method), c.cell.lr)):
        for why, n in sorted(causes(c.breaks).items()):
            depth = "" if c.cell.depth is None else str(c.cell.depth)
            rows.append(f"| {depth} | {c.cell.lr:g} | {c.cell.method} | {why} | {n}/{c.count} |")
    if not rows:
        return ""
    cause = f"cause ({precision})" if precision else "cause"
    return f"| depth | lr | method | {cause} | runs |\n|---|---|---|---|---|\n" + "\n".join(rows)


def cause_section(cells: Sequence[CellSummary]) -> list[str]:
    """The report's failures by cause: per cell that had any, how many runs failed by each cause
    (:func:`cause_table`: the criterion, and for a run stopped on non-finite steps the module where
    its last skipped step overflowed). Empty without a failure."""
    table = cause_table(cells)
    if not table:
        return []
    return ["## Failures by cause", CAUSES_READ, table]


def seeds_table(cells: Sequence[CellSummary]) -> str:
    """Which runs the sweep holds when its cells ran different seeds: one row per depth, set of seeds
    and set of methods, with the lrs at which those methods ran exactly those seeds and the number of
    runs. Empty when every cell ran the same seeds."""
    if len({frozenset(c.seeds) for c in cells}) < 2:
        return ""
    methods_at: dict[tuple, dict[float, list[str]]] = {}
    for c in cells:
        key = (c.cell.depth, frozenset(c.seeds))
        methods_at.setdefault(key, {}).setdefault(c.cell.lr, []).append(c.cell.method)
    rows = []
    for depth, seeds in sorted(methods_at, key=lambda k: (k[0] or 0, -len(k[1]), sorted(k[1]))):
        lrs_of: dict[tuple[str, ...], list[float]] = {}
        for lr, ms in sorted(methods_at[depth, seeds].items()):
            lrs_of.setdefault(tuple(sorted(ms, key=method_order)), []).append(lr)
        for ms, lrs in lrs_of.items():
            row = ["" if depth is None else str(depth), seed_list(seeds), ", ".join(ms)]
            rows.append(row + [", ".join(f"{lr:g}" for lr in lrs), str(len(seeds) * len(ms) * len(lrs))])
    return markdown_table(["depth", "seeds", "methods", "lrs", "runs"], rows)
