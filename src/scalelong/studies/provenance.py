"""Every run of a study as data: what made it and what it did, beside the study's map.json.

``runs.json`` holds the study's base config once and, per run, the keys where its config differs,
the provenance its summary.json records (commit, torch, the precision it really ran in, the device;
:mod:`scalelong.runlog.provenance`), its verdict by the failure rule and its time series as numbers (loss,
lr, hidden-feature norm and fp16 headroom at every logged step, the held-out x0 error at every
probe), and the largest |value| each block's output reached (``peak_absmax``). So a reader can
recompute any table of the report, check a number quoted from it, and see which commit and
precision each cell rests on (:func:`cell_provenance`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from scalelong.diagnostics import metric_names as names
from scalelong.runlog.records import series, write_text_atomic
from scalelong.studies.heldout import heldout_x0_series
from scalelong.studies.magnitude import peak_absmax
from scalelong.studies.markdown import markdown_table
from scalelong.studies.summary import Cell, StudyRun
from scalelong.training.config import config_to_dict, read_yaml
from scalelong.training.runs import config_differences

# The series every run carries, by metrics-log key.
SERIES = {
    "loss": names.LOSS,
    "lr": "lr",
    "feature_norm": names.FEATURE_NORM,
    "fp16_headroom": names.FP16_HEADROOM,
}
PROVENANCE_KEYS = ("commit", "torch", "precision", "device_name")
# Options that change what the terminal shows, not a run: left out of the commands a report prints.
DISPLAY_ONLY = frozenset({"--no-progress"})


def _number(x: float) -> float | None:
    return x if math.isfinite(x) else None  # JSON has no NaN; inf too reads as null


def run_json(run: StudyRun, base: dict) -> dict:
    """One run: its name, seed, config differences to ``base``, provenance, verdict and series."""
    entry: dict = {"run": run.name, "seed": run.seed}
    if run.path is not None and (run.path / "config.yaml").is_file():
        entry["config"] = config_differences(base, read_yaml(run.path / "config.yaml"), free=())
    entry["provenance"] = run.summary.get("provenance")
    entry["status"] = run.summary.get("status")
    entry["failed"] = [{"criterion": d.criterion, "step": d.step, "detail": d.detail} for d in run.breaks]
    data: dict = {}
    for label, key in SERIES.items():
        steps, values = series(run.records, key)
        if steps:
            data[label] = {"step": steps, "value": [_number(v) for v in values]}
    steps, values = heldout_x0_series(run.records)
    if steps:
        data["heldout_x0_error"] = {"step": steps, "value": [_number(v) for v in values]}
    entry["series"] = data
    if peaks := peak_absmax(run.records):  # where fp16 would overflow: scalelong.studies.magnitude
        entry["peak_absmax"] = {block: _number(v) for block, v in peaks.items()}
    return entry


def write_runs_json(base_config, runs: Mapping[Cell, Sequence[StudyRun]], path: Path) -> Path:
    """``runs.json``: the base config and every run of every cell (:func:`run_json`)."""
    base = config_to_dict(base_config)
    cells = [
        {
            "depth": cell.depth,
            "lr": cell.lr,
            "method": cell.method,
            "runs": [run_json(r, base) for r in rs],
        }
        for cell, rs in runs.items()
    ]
    write_text_atomic(path, json.dumps({"base_config": base, "cells": cells}) + "\n")
    return path


def cell_provenance(runs: Sequence[StudyRun]) -> dict[str, list[str]]:
    """Per provenance key, the distinct values among ``runs`` ("unrecorded" for a run whose summary
    has none): where a cell mixes commits or precisions, the report says so."""
    out: dict[str, list[str]] = {}
    for key in PROVENANCE_KEYS:
        seen = []
        for r in runs:
            made = r.summary.get("provenance") or {}
            value = str(made.get(key) or "unrecorded")
            if key == "commit" and value != "unrecorded":
                value = value[:10] + ("+dirty" if value.endswith("+dirty") else "")
            if value not in seen:
                seen.append(value)
        out[key] = seen
    return out


def provenance_section(runs: Mapping[Cell, Sequence[StudyRun]]) -> list[str]:
    """What made the runs: one line when every run shares commit, torch, precision and device;
    else a table of the cells with their mixture, so nothing is mixed silently."""
    every = [r for rs in runs.values() for r in rs]
    if not every:
        return []
    whole = cell_provenance(every)
    heading = "## What made the runs"
    made = commands(every)
    said = (
        ["The commands that made them (runs each):", "\n".join(f"    {c}  # {n}" for c, n in made.items())]
        if made
        else []
    )
    if all(len(v) == 1 for v in whole.values()):
        line = ", ".join(f"{k} {v[0]}" for k, v in whole.items())
        return [
            heading,
            f"Every run: {line}. Each run's provenance, config and time series: `runs.json`.",
            *said,
        ]
    rows = []
    for cell, rs in runs.items():
        made = cell_provenance(rs)
        row = ["" if cell.depth is None else str(cell.depth), f"{cell.lr:g}", cell.method, str(len(rs))]
        row += [", ".join(made[k]) for k in PROVENANCE_KEYS]
        rows.append(row)
    return [
        heading,
        "The runs were not all made by the same commit, torch, precision and device: per cell, every "
        "value among its runs. Each run's provenance, config and time series: `runs.json`.",
        markdown_table(["depth", "lr", "method", "seeds", *PROVENANCE_KEYS], rows),
        *said,
    ]


def commands(runs: Sequence[StudyRun]) -> dict[str, int]:
    """Every command line that made one of ``runs`` (from its provenance), with how many runs it made."""
    out: dict[str, int] = {}
    for r in runs:
        argv = (r.summary.get("provenance") or {}).get("argv")
        if argv:
            # `python -m scalelong.cli` recorded by a version that kept the script's name
            first = "scalelong" if argv[0] in ("cli.py", "__main__.py") else argv[0]
            line = " ".join([first, *(a for a in argv[1:] if a not in DISPLAY_ONLY)])
            out[line] = out.get(line, 0) + 1
    return out
