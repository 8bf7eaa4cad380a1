"""What ``scalelong sweep`` calls: train the grid's runs and write the map (:func:`run_sweep`), or
write the map of what has finished without training (:func:`report_sweep`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from scalelong.errors import ScaleLongError
from scalelong.studies.divergence import DEFAULT_RULE, DivergenceRule
from scalelong.studies.running import StudyResult, run_all
from scalelong.studies.summary import read_run
from scalelong.studies.sweep.beside import (
    Beside,
    RunKey,
    load_beside,
    recorded_beside,
    require_shared,
    run_keys,
)
from scalelong.studies.sweep.figures import check_fig1_lr
from scalelong.studies.sweep.grid import cell_of, collect, plan
from scalelong.studies.sweep.mapfile import agreement_section, read_map
from scalelong.studies.sweep.report import write_sweep_report
from scalelong.training.config import Config

if TYPE_CHECKING:
    from scalelong.studies.cluster import ClusterOptions


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
    beside: str | Path | None = None,
    warn=print,
) -> StudyResult:
    """Train every cell's seeds (reusing finished runs; ``jobs`` at a time, ``gpus_per_run`` GPUs
    each where there are GPUs, or as a cluster's jobs: :func:`scalelong.studies.running.run_all`),
    then write the map of every finished run of this config in ``sweep_dir``. A diverged run is
    a result; a run that fails is reported and left out. ``fig1_lr``: the lr of the report's
    Fig. 1 (one of ``lrs``; None: the smallest). Jobs submitted without waiting
    (``cluster.wait`` False) write no report: :func:`report_sweep` writes it later. ``beside``: the
    map of the same grid in another precision (a sweep's folder or its map.json), checked before any
    run trains (:func:`scalelong.studies.sweep.beside.load_beside`: it must share a run with the
    plan) and set beside this sweep in the report; without it, the map beside that this sweep's
    map.json recorded, if any."""
    check_fig1_lr(fig1_lr, lrs)
    runs_dir = sweep_dir / "runs"
    cfgs = plan(base, methods, lrs, depths, seeds, runs_dir)
    # a --beside that does not fit is refused before anything trains or is written
    side = _beside(beside, sweep_dir, _planned(cfgs), warn) if beside is not None else None
    _keep_map_of_runs_gone(sweep_dir, _planned(cfgs))
    outcomes = run_all(cfgs, jobs, progress, train_kwargs, gpus_per_run=gpus_per_run, cluster=cluster)
    if cluster is not None and not cluster.wait:  # the jobs have only just been submitted
        return StudyResult(sweep_dir / "report.md", "", outcomes, reported=False)
    failed = [
        read_run(c.run_dir, error=o.message)
        for c, o in zip(cfgs, outcomes, strict=True)
        if o.status == "failed"
    ]
    runs = collect(base, runs_dir, rule)
    side = side or recorded_beside(sweep_dir, _keys(runs), warn)
    report, tables = write_sweep_report(base, runs, sweep_dir, failed, rule, fig1_lr, beside=side)
    return StudyResult(report, tables, outcomes)


def _keep_map_of_runs_gone(sweep_dir: Path, planned: set[RunKey]) -> None:
    """Refuse a sweep in a folder whose map.json holds runs that have no folder there and are not in the
    plan (a study's folder kept without its runs): the map it writes would hold its own runs only."""
    saved = sweep_dir / "map.json"
    if not saved.is_file():
        return
    try:
        cells, _, _ = read_map(saved)
    except ScaleLongError:  # not a map this sweep could read: nothing in it to keep
        return
    gone = sorted(
        c.cell.name(r.seed)
        for c in cells
        for r in c.runs
        if (c.cell.depth, c.cell.lr, c.cell.method, r.seed) not in planned
        and not (sweep_dir / "runs" / c.cell.name(r.seed)).is_dir()
    )
    if gone:
        raise ScaleLongError(
            f"{saved} holds {len(gone)} run(s) whose folders are not in {sweep_dir / 'runs'} (e.g. "
            f"{gone[0]}), and the map this sweep writes would drop them: copy those runs back, or move "
            "map.json elsewhere first"
        )


def _planned(cfgs: Sequence[Config]) -> set[RunKey]:
    """The runs a plan will make, each as (depth, lr, method, seed)."""
    keys = set()
    for cfg in cfgs:
        cell = cell_of(cfg)
        keys.add((cell.depth, cell.lr, cell.method, cfg.train.seed))
    return keys


def _keys(runs: Mapping) -> set[RunKey]:
    """The runs of ``runs`` (by cell), each as (depth, lr, method, seed)."""
    return {(cell.depth, cell.lr, cell.method, r.seed) for cell, rs in runs.items() for r in rs}


def _beside(given: str | Path | None, sweep_dir: Path, keys: set[RunKey], warn) -> Beside | None:
    """The map set beside the report: ``given`` (refused where it does not fit), else the one this
    sweep's map.json recorded."""
    if given is None:
        return recorded_beside(sweep_dir, keys, warn)
    side = load_beside(given)
    require_shared(side, keys, given)
    return side


def report_sweep(
    base: Config,
    sweep_dir: Path,
    rule: DivergenceRule = DEFAULT_RULE,
    fig1_lr: float | None = None,
    warn=print,
    beside: str | Path | None = None,
) -> Path:
    """Write the report of every finished run of ``base`` in ``sweep_dir`` without training:
    after a sweep that was cut short (a time limit, a crash), the map of what finished. Where the
    run folders are gone but the sweep's map.json is there, the report is made from it
    (:func:`scalelong.studies.sweep.mapfile.read_map`, judged by today's rule), with one line through
    ``warn`` naming what the file lacks. ``beside``: as :func:`run_sweep`'s, checked before anything
    is written (it must share a run with the report's). Returns the path of report.md."""
    runs = collect(base, sweep_dir / "runs", rule)
    if runs:
        side = _beside(beside, sweep_dir, _keys(runs), warn)
        return write_sweep_report(base, runs, sweep_dir, rule=rule, fig1_lr=fig1_lr, beside=side)[0]
    saved = sweep_dir / "map.json"
    if not saved.is_file():
        raise ScaleLongError(f"{sweep_dir / 'runs'} holds no finished run of this config: nothing to report")
    cells, lacking, recorded = read_map(saved)
    side = _beside(beside, sweep_dir, run_keys(cells), warn)
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
        base,
        None,
        sweep_dir,
        rule=rule,
        fig1_lr=fig1_lr,
        cells=cells,
        extra=extra,
        recorded=recorded,
        beside=side,
    )[0]
