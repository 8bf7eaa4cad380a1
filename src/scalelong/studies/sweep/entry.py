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
from scalelong.studies.sweep.figures import check_fig1_lr
from scalelong.studies.sweep.grid import collect, plan
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
    (:func:`scalelong.studies.sweep.mapfile.read_map`, judged by today's rule), with one line through
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
