"""A comparison's numbers: the steps each method needs to reach the baseline's final FD (and its
speed-up), and the per-method summaries of the seeds its table and reading are made of."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scalelong.diagnostics import metric_names as names
from scalelong.errors import ScaleLongError
from scalelong.studies.plots import Records, series
from scalelong.studies.summary import MethodSummary, StudyRun, summarise_run


@dataclass
class TargetResult:
    """Steps each method needs to reach the baseline's final value of a lower-is-better metric."""

    target: float  # the baseline's last finite value
    steps: dict[str, int | None]  # first logged step at or below target; None if never reached
    speedup: dict[str, float | None]  # baseline's steps / method's steps


def steps_to_target(
    records_by_method: Mapping[str, Records], baseline: str, key: str = names.FD
) -> TargetResult:
    """Steps to reach the baseline's final ``key`` (e.g. Frechet distance) and the speed-up.

    The baseline's own count is the first step at which it reached its final value (which can
    be earlier than its last step when the metric is not monotone), so the baseline's speed-up is 1.
    """
    if baseline not in records_by_method:
        raise ScaleLongError(f"baseline {baseline!r} not among the methods {sorted(records_by_method)}")
    _, base_values = series(records_by_method[baseline], key)
    finite = [v for v in base_values if math.isfinite(v)]
    if not finite:
        raise ScaleLongError(f"the baseline {baseline!r} has no finite {key!r} values")
    target = finite[-1]
    steps: dict[str, int | None] = {}
    for method, records in records_by_method.items():
        # NaN compares False, so a diverged evaluation never counts as reaching the target.
        steps[method] = next((s for s, v in zip(*series(records, key), strict=True) if v <= target), None)
    base_steps = steps[baseline]
    speedup = {m: (base_steps / s if s and base_steps else None) for m, s in steps.items()}
    return TargetResult(target, steps, speedup)


def _targets(records_by_method: Mapping[str, Records], baseline: str, key: str) -> TargetResult:
    try:
        return steps_to_target(records_by_method, baseline, key)
    except ScaleLongError:  # no finite baseline value (no evaluation, or it diverged): no target
        return TargetResult(math.nan, dict.fromkeys(records_by_method), dict.fromkeys(records_by_method))


def summarise(studies: Mapping[str, Sequence[StudyRun]], baseline: str) -> list[MethodSummary]:
    """Per-method summaries of ``studies[method]`` (its runs, one per seed): each run's
    :class:`~scalelong.studies.summary.SeedSummary`, and the step at which it reached the final
    FD of the baseline's run of the same seed (:func:`steps_to_target`; None without that run)."""
    if baseline not in studies:
        raise ScaleLongError(f"baseline {baseline!r} not among the methods {sorted(studies)}")
    base = {r.seed: r.records for r in studies[baseline] if r.seed is not None}

    def reached(run: StudyRun) -> int | None:
        if run.seed not in base:
            return None
        return _targets({"run": run.records, "baseline": base[run.seed]}, "baseline", names.FD).steps["run"]

    return [
        MethodSummary(method, [summarise_run(r) for r in runs], [reached(r) for r in runs])
        for method, runs in studies.items()
    ]
