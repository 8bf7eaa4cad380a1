"""Each method against ``none`` seed by seed: does it rescue the runs that plain skips lose?

A seed gives both methods the same batches, noise and trunk initialisation, so failure is compared
as a paired 2x2 table over the seeds both ran (:class:`~scalelong.studies.statistics.PairedOutcomes`)
with the exact McNemar test on the discordant seeds: a rescue shows as seeds where ``none`` failed and
the method trained, with few or none the other way. Among the seeds where both trained, what the
method changes: the fp16 headroom as a paired ratio and the held-out x0 error as a paired difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scalelong.skips import method_order
from scalelong.studies.markdown import markdown_table
from scalelong.studies.statistics import Contrast, PairedOutcomes, contrast, fmt_contrast, paired_outcomes
from scalelong.studies.summary import CellSummary

BASELINE = "none"

RESCUE = (
    "A method **rescues** `none` at an lr when, over at least 5 shared seeds, it fails on fewer seeds "
    "than `none` and the exact McNemar test on the discordant seeds gives p < 0.05 (two-sided). With "
    "exact McNemar this needs at least 6 discordant seeds, all or nearly all one way (6 of 6: p = 0.031; "
    "8 of 9: p = 0.039): a rescue of a small fraction of the seeds needs many of them."
)


def _failed(cell: CellSummary) -> dict[int, bool]:
    return {r.seed: bool(r.breaks) for r in cell.runs if r.seed is not None}


def _both_trained(cell: CellSummary, baseline: CellSummary, key: str) -> tuple[list, list, list, list]:
    """``key`` of both sides, NaN at every seed where either failed (so only trained pairs enter)."""
    ok = {s for s, f in _failed(cell).items() if not f} & {s for s, f in _failed(baseline).items() if not f}

    def values(c: CellSummary) -> list[float]:
        return [v if s in ok else math.nan for s, v in zip(c.seeds, c.values(key), strict=True)]

    return values(cell), values(baseline), cell.seeds, baseline.seeds


def pairs(cells: Sequence[CellSummary]) -> list[tuple[CellSummary, CellSummary]]:
    """Every (cell, ``none``'s cell) of the same depth and lr, by depth, lr and method order."""
    by = {(c.cell.depth, c.cell.lr, c.cell.method): c for c in cells}
    found = [
        (c, by[c.cell.depth, c.cell.lr, BASELINE])
        for c in cells
        if c.cell.method != BASELINE and (c.cell.depth, c.cell.lr, BASELINE) in by
    ]
    return sorted(found, key=lambda p: (p[0].cell.depth or 0, p[0].cell.lr, method_order(p[0].cell.method)))


def outcomes(cell: CellSummary, baseline: CellSummary) -> PairedOutcomes:
    return paired_outcomes(_failed(cell), _failed(baseline))


def headroom_ratio(cell: CellSummary, baseline: CellSummary) -> Contrast | None:
    """The least fp16 headroom over ``none``'s, paired by seed over the seeds where both trained."""
    return contrast(*_both_trained(cell, baseline, "fp16_headroom"), ratio=True)


def x0_difference(cell: CellSummary, baseline: CellSummary) -> Contrast | None:
    """The final held-out x0 error less ``none``'s, paired over the seeds where both trained."""
    return contrast(*_both_trained(cell, baseline, "x0_error"))


def paired_table(cells: Sequence[CellSummary]) -> str:
    """One row per method and lr against ``none``: the paired 2x2 failure table, McNemar's p, and
    among the seeds where both trained the headroom ratio and the x0 difference."""
    head = ["depth", "lr", "method", "shared seeds", "both failed", "only none failed", "only method failed"]
    head += [
        "both trained",
        "McNemar p",
        "fp16 headroom / none (both trained)",
        "x0 error - none (both trained)",
    ]
    rows = []
    for c, ref in pairs(cells):
        t = outcomes(c, ref)
        if not t.n:
            continue
        row = ["" if c.cell.depth is None else str(c.cell.depth), f"{c.cell.lr:g}", c.cell.method, str(t.n)]
        row += [str(t.both), str(t.only_baseline), str(t.only_method), str(t.neither), f"{t.p:.2g}"]
        row += [fmt_contrast(headroom_ratio(c, ref), unit="x"), fmt_contrast(x0_difference(c, ref))]
        rows.append(row)
    return markdown_table(head, rows) if rows else ""


def paired_section(cells: Sequence[CellSummary]) -> list[str]:
    """The report's section: the rule of a rescue, stated before the data, and the table."""
    table = paired_table(cells)
    if not table:
        return []
    return [
        "## Failure paired by seed: each method against `none`",
        "Per lr, over the seeds both ran: on how many seeds both failed, only `none` failed (a rescue), "
        "only the method failed, or both trained, by the one failure rule above; the exact McNemar test "
        "on the discordant seeds (two-sided); and among the seeds where both trained, the least fp16 "
        "headroom as a ratio to `none`'s (geometric mean, 95% interval) and the held-out x0 error less "
        "`none`'s. " + RESCUE,
        table,
    ]


def _number(x: float) -> float | None:
    return x if math.isfinite(x) else None


def paired_json(cells: Sequence[CellSummary]) -> list[dict]:
    """The rows of :func:`paired_table` as numbers, for map.json."""

    def contrast_json(k: Contrast | None) -> dict | None:
        if k is None:
            return None
        return {"estimate": _number(k.estimate), "low": _number(k.low), "high": _number(k.high), "n": k.n}

    rows = []
    for c, ref in pairs(cells):
        t = outcomes(c, ref)
        if t.n:
            rows.append(
                {
                    "depth": c.cell.depth,
                    "lr": c.cell.lr,
                    "method": c.cell.method,
                    "shared_seeds": t.n,
                    "both_failed": t.both,
                    "only_none_failed": t.only_baseline,
                    "only_method_failed": t.only_method,
                    "both_trained": t.neither,
                    "mcnemar_p": t.p,
                    "fp16_headroom_ratio": contrast_json(headroom_ratio(c, ref)),
                    "x0_error_minus_none": contrast_json(x0_difference(c, ref)),
                }
            )
    return rows
