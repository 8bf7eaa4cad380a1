"""A sweep's map.json: written with every cell's per-seed numbers (:func:`write_map_json`), and read
back into the cells a report is made of when its runs are gone.

A study's run folders are large and often left behind on the machine that trained them; its map.json
travels with the report. :func:`read_map` turns every cell of one back into a
:class:`~scalelong.studies.summary.CellSummary` and judges each run again by today's failure rule
(:mod:`scalelong.studies.divergence`) from the numbers the file holds: (a) from the criteria it
recorded, (x0) from its held-out x0 error and the mean image's. A file of an older format lacks
columns (provenance, time series, feature growth; the first format even the seed numbers);
:func:`read_map` names them, so the report says what it cannot show. :func:`agreement_section`
sets the verdicts the file recorded beside today's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from scalelong.errors import ScaleLongError
from scalelong.runlog.records import write_text_atomic
from scalelong.skips import method_order
from scalelong.studies.divergence import DEFAULT_RULE, NO_NOISE_ERROR, Divergence, heldout_failure
from scalelong.studies.summary import Cell, CellSummary, SeedSummary
from scalelong.studies.sweep.basin import Basin, basin_json, basins, comparison_sensitivity
from scalelong.studies.sweep.edges import edges_json
from scalelong.studies.sweep.paired import paired_json

# map.json column -> SeedSummary field
COLUMNS = {
    "final_loss": "final_loss",
    "final_fd": "final_fd",
    "feature_norm": "feature_norm",
    "feature_growth": "feature_growth",
    "feature_norm_osc_std": "feature_osc",
    "loss_spikes": "spikes",
    "fp16_headroom_least": "fp16_headroom",
    "digits_confident": "confident",
    "digits_entropy": "entropy",
    "heldout_x0_error": "x0_error",
    "heldout_x0_error_raw": "x0_error_raw",
    "heldout_x0_error_start": "x0_error_start",
    "x0_mean_image": "x0_mean_image",
    "heldout_eps_error": "eps_error",
    "heldout_eps_error_raw": "eps_error_raw",
    "heldout_eps_error_start": "eps_error_start",
    "overflow_steps": "overflow_steps",
    "nonfinite_steps": "nonfinite_steps",
}
# map.json column of text -> SeedSummary field ("" where the column or the value is missing)
TEXT_COLUMNS = {"precision": "precision", "last_skipped": "last_skipped", "prediction": "prediction"}
# What a report needs beyond the cells, and where today's writer puts it.
EXPECTED = {"feature_growth": "feature growth", "failed": "verdicts by today's rule"}


def write_map_json(
    cells: Sequence[CellSummary],
    path: Path,
    key: str,
    found: Sequence[Basin] | None = None,
    recorded: Mapping[tuple, list[dict]] | None = None,
    beside: Mapping | None = None,
) -> Path:
    """Every cell's per-seed numbers as JSON (``final`` is the final ``key``: fd or loss), with
    each value's seed, for tables and plots made elsewhere: the held-out x0 errors (EMA, trained
    weights, untrained model at step 0, mean image), each run's cap l0 of the lr basin with its
    source and its capped value, its precision and the steps it skipped; and where the map has two
    lrs or more, ``basin``, per (method, depth), the numbers of the lr basin
    (:func:`scalelong.studies.sweep.basin.basin_json`), so the basin tables can be rebuilt from the
    file, and ``edges``, the largest stable lr of each comparison on equal seeds
    (:func:`scalelong.studies.sweep.edges.edges_json`). ``found``: the basins of ``cells`` where
    already computed; ``recorded``: the verdicts a map read back recorded (:func:`read_map`), kept;
    ``beside``: where the map of another precision set beside this one is
    (:func:`scalelong.studies.sweep.beside.beside_record`), so a rebuild finds it."""

    def number(x: float) -> float | None:
        return x if math.isfinite(x) else None  # JSON has no NaN

    found = basins(cells) if found is None else found
    read = {(b.depth, b.method, r.lr, r.seed): r for b in found for r in b.runs}

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
            "heldout_eps_error": [number(x) for x in c.values("eps_error")],
            "heldout_eps_error_raw": [number(x) for x in c.values("eps_error_raw")],
            "heldout_eps_error_start": [number(x) for x in c.values("eps_error_start")],
            "prediction": [r.prediction or None for r in c.runs],
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
            "precision": [r.precision or None for r in c.runs],
            "overflow_steps": [number(x) for x in c.values("overflow_steps")],
            "nonfinite_steps": [number(x) for x in c.values("nonfinite_steps")],
            "last_skipped": [r.last_skipped or None for r in c.runs],
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
    if len({c.cell.lr for c in cells}) > 1:  # a basin needs two lrs (basin_section)
        data |= {"basin_weights": "ema (lr_sensitivity_raw: the trained weights)", "basin": basin_json(found)}
        depths = sorted({b.depth for b in found}, key=lambda d: -1 if d is None else d)
        data["edges"] = [
            e for d in depths for e in edges_json([b for b in found if b.depth == d], comparison_sensitivity)
        ]
    if beside:
        data["beside"] = dict(beside)
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")
    return path


def _value(x: object) -> float:
    return float(x) if isinstance(x, (int, float)) else math.nan


def _divergence(d: Mapping) -> Divergence:
    return Divergence(d["criterion"], None if d.get("step") is None else int(d["step"]), d["detail"])


def judge(
    said: Sequence[Mapping], written: Sequence[Mapping], kind: str, error: float, baseline: float
) -> tuple[Divergence, ...]:
    """Today's verdict on one run from a map's numbers. ``said``: the verdicts the map holds for it
    (recorded under an earlier rule, else today's as written); ``written``: today's as written;
    ``kind``: ``x0`` (``error`` the held-out x0 error, ``baseline`` the mean image's) or ``eps`` (a
    network that predicts the noise: its noise error against 1). (a) where ``said`` has it end
    non-finite; (x0) or (eps) where the error is missing (a map writes a non-finite error as null) or
    not below the baseline, with the step and cause the map wrote for it where it wrote one (a loss
    collapse on the way); a run whose map has no held-out error, or no baseline to judge it by,
    keeps its loss criterion."""
    found = tuple(_divergence(d) for d in said if d["criterion"] == "nonfinite")
    if found:
        return found
    if math.isnan(baseline):  # no held-out error to judge by in this study: the loss judges
        return tuple(_divergence(d) for d in said if d["criterion"] == "loss")
    if error < baseline:
        return ()
    kept = [_divergence(d) for d in written if d["criterion"] == kind]
    if kept:
        return (kept[0],)
    step = max((int(d["step"]) for d in said if d.get("step") is not None), default=None)
    return (heldout_failure(kind, step, error, baseline),)


def read_map(path: Path) -> tuple[list[CellSummary], list[str], dict[tuple, list[dict]]]:
    """The cells of ``path`` (a sweep's map.json) with today's verdicts, the columns of today's
    format it lacks (their labels), and per run (depth, lr, method, seed) the verdict recorded under
    an earlier rule (``recorded_criteria``, or the first formats' ``diverged``; none for a map written
    under today's rule)."""
    try:
        data = json.loads(path.read_text())
        rows = data["cells"]
        metric = data.get("metric", "loss")
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise TypeError("its cells are not a list of objects")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ScaleLongError(
            f"{path}: not a sweep's map.json ({type(e).__name__}: {e}); write it with scalelong sweep"
        ) from None
    lacking = [
        label
        for key, label in EXPECTED.items()
        if rows and all(v is None for row in rows for v in (row.get(key) or [None]))
    ]
    if rows and not (path.parent / "runs.json").is_file():
        lacking.insert(0, "per-run provenance and time series (no runs.json)")
    if any("seed" not in row for row in rows):
        # the first format counted a cell's seeds only; `--seeds n` has always run seeds 0 to n-1
        lacking.append("seed numbers (read as 0 to n-1)")
    recorded_by_run: dict[tuple, list[dict]] = {}
    cells = []
    try:
        for row in rows:
            cells.append(_cell(row, metric, recorded_by_run))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise ScaleLongError(
            f"{path}: a cell of this map.json is incomplete ({type(e).__name__}: {e}); "
            "write it again with scalelong sweep"
        ) from None
    return cells, lacking, recorded_by_run


def _cell(row: Mapping, metric: str, recorded_by_run: dict[tuple, list[dict]]) -> CellSummary:
    """One cell of a map.json, its runs judged by today's rule; records each run's verdict of an
    earlier rule, where the map kept one."""
    cell = Cell(None if row["depth"] is None else int(row["depth"]), float(row["lr"]), str(row["method"]))
    seed_numbers = row["seed"] if "seed" in row else list(range(int(row["seeds"])))
    # the verdicts recorded under an earlier rule: kept as such when the map is written again
    earlier = row.get("recorded_criteria") or row.get("diverged")
    written = row.get("failed") or [[] for _ in seed_numbers]  # today's, as the map wrote them
    said = earlier or written
    seeds = []
    for i, s in enumerate(seed_numbers):
        values = {field: _value(row[col][i]) for col, field in COLUMNS.items() if col in row}
        text = {field: str(row[col][i] or "") for col, field in TEXT_COLUMNS.items() if col in row}
        if metric == "fd" and "final_fd" in row:
            values["final_fd"] = _value(row["final_fd"][i])
        if text.get("prediction") == "eps":  # judged by its noise error against 1, as divergence() does
            held = ("eps", values.get("eps_error", math.nan), NO_NOISE_ERROR)
        else:
            held = ("x0", values.get("x0_error", math.nan), values.get("x0_mean_image", math.nan))
        breaks = judge(said[i], written[i], *held)
        seeds.append(SeedSummary(seed=s, breaks=breaks, **values, **text))
        if earlier:
            recorded_by_run[(cell.depth, cell.lr, cell.method, s)] = list(earlier[i])
    return CellSummary(cell, seeds, metric)


def agreement_section(cells: Sequence[CellSummary], recorded: Mapping[tuple, list[dict]]) -> list[str]:
    """Today's failure rule beside the verdicts the map recorded: the basin's old (a)+(b) and the
    map's old (a)+(b)+(c), as counts of runs, with the runs where they disagree named."""
    pairs = []
    for c in cells:
        for r in c.runs:
            old = recorded.get((c.cell.depth, c.cell.lr, c.cell.method, r.seed))
            if old is not None:
                pairs.append((c, r, {d["criterion"] for d in old}))
    if not pairs:
        return []
    rules = {
        "(a)+(b): non-finite, loss": {"nonfinite", "loss"},
        "(a)+(b)+(c): and feature growth": {"nonfinite", "loss", "feature_norm"},
    }
    lines = [
        "| recorded rule | both: failed | both: trained | only the recorded rule failed it "
        "| only today's failed it |",
        "|---|---|---|---|---|",
    ]
    for label, criteria in rules.items():
        old = [bool(o & criteria) for _, _, o in pairs]
        new = [bool(r.breaks) for _, r, _ in pairs]
        both = sum(a and b for a, b in zip(old, new, strict=True))
        neither = sum(not a and not b for a, b in zip(old, new, strict=True))
        only_old = sum(a and not b for a, b in zip(old, new, strict=True))
        only_new = sum(b and not a for a, b in zip(old, new, strict=True))
        lines.append(f"| {label} | {both} | {neither} | {only_old} | {only_new} |")
    basin_rule = rules["(a)+(b): non-finite, loss"]
    differ = [
        f"{c.cell.method} lr {c.cell.lr:g} seed {r.seed} (depth {c.cell.depth}): recorded "
        f"{'failed' if o & basin_rule else 'trained'}, today {'failed' if r.breaks else 'trained'} "
        f"(x0 {r.x0_error:.3g}, mean image {r.x0_mean_image:.3g})"
        for c, r, o in pairs
        if bool(o & basin_rule) != bool(r.breaks)
    ]
    parts = [
        "## Today's rule against the verdicts recorded",
        f"The {len(pairs)} runs of this map as judged when they were made, (a) non-finite, (b) the loss "
        "against the input-free loss, (c) the hidden-feature norm past 100x its first logged value, "
        "beside today's one rule (non-finite, or a final held-out x0 error not below the mean image's; "
        "(b) where a run logged no held-out error).",
        "\n".join(lines),
    ]
    if differ:
        parts.append("Where (a)+(b) and today's rule disagree: " + "; ".join(differ) + ".")
    return parts
