"""What ``scalelong compare`` calls: train every method's seeds and write the report
(:func:`run_comparison`), or write the report of what has finished without training
(:func:`report_comparison`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from scalelong.errors import ScaleLongError
from scalelong.studies.compare.configs import comparison_configs
from scalelong.studies.compare.report import write_comparison_report, write_report
from scalelong.studies.report import DIGIT_HEADER, digit_legend
from scalelong.studies.running import StudyResult, concluded, run_all
from scalelong.studies.summary import StudyRun, read_run
from scalelong.training.config import Config
from scalelong.training.runs import RunDir

if TYPE_CHECKING:
    from scalelong.studies.cluster import ClusterOptions


def run_comparison(
    base: Config,
    methods: Sequence[str],
    seeds: int,
    report_dir: Path,
    progress: bool = True,
    jobs: int | None = 1,
    train_kwargs: Mapping | None = None,
    gpus_per_run: int = 1,
    cluster: ClusterOptions | None = None,
) -> StudyResult:
    """Train every method for every seed (reusing finished runs; ``jobs`` at a time,
    ``gpus_per_run`` GPUs each where there are GPUs, or as a cluster's jobs:
    :func:`scalelong.studies.running.run_all`) and write the report. Runs that diverge or fail
    are recorded in it; the others are trained all the same. A run whose job ended before it
    did is left out of the report, as is every run when the jobs were submitted without waiting
    (``cluster.wait`` False: :func:`report_comparison` writes the report later)."""
    cfgs = comparison_configs(base, methods, seeds, report_dir)
    outcomes = run_all(cfgs, jobs, progress, train_kwargs, gpus_per_run=gpus_per_run, cluster=cluster)
    if cluster is not None and not cluster.wait:  # the jobs have only just been submitted
        return StudyResult(report_dir / "report.md", "", outcomes, reported=False)
    if any(o.unfinished for o in outcomes):  # what has finished, as --report-only reads it
        try:
            report, table = report_comparison(base, methods, seeds, report_dir)
        except ScaleLongError:  # the baseline has no finished run yet
            return StudyResult(report_dir / "report.md", "", outcomes, reported=False)
        return StudyResult(report, table, outcomes)
    studies: dict[str, list[StudyRun]] = {m: [] for m in methods}
    for cfg, outcome in zip(cfgs, outcomes, strict=True):
        error = outcome.message if outcome.status == "failed" else ""
        studies[cfg.model.skip.method].append(read_run(cfg.run_dir, error=error))
    written = write_comparison_report(studies, methods[0], report_dir, base)
    legend = digit_legend(markdown=False) if DIGIT_HEADER in written.table else ""
    return StudyResult(written.path, written.table, outcomes, legend, written.reading)


def report_comparison(base: Config, methods: Sequence[str], seeds: int, report_dir: Path) -> tuple[Path, str]:
    """Write the report of the comparison's runs that have concluded, without training: while a
    cluster's jobs are still running, or after a study cut short. Methods with no concluded run
    are left out; the baseline (``methods[0]``) needs one. Returns report.md's path and the table."""
    studies: dict[str, list[StudyRun]] = {}
    for cfg in comparison_configs(base, methods, seeds, report_dir):
        if concluded(RunDir(cfg.run_dir)):
            studies.setdefault(cfg.model.skip.method, []).append(read_run(cfg.run_dir))
    if methods[0] not in studies:
        raise ScaleLongError(
            f"no run of the baseline {methods[0]!r} has finished in {report_dir / 'runs'}: "
            "nothing to report yet"
        )
    ordered = {m: studies[m] for m in methods if m in studies}
    return write_report(ordered, methods[0], report_dir, base)
